// Replaced when the exporters land.
