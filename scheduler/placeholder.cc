// Replaced when the planner lands.
