// Private to comm/: the backend factories that transport.cc and all_reduce.cc dispatch
// to, and the bootstraps' shared helpers. The CUDA ones exist only when built with CUDA
// (PIPESCHED_HAS_CUDA).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipesched/comm/all_reduce.h"
#include "pipesched/comm/transport.h"

namespace pipesched::comm::internal {

// What every bootstrap kind (bootstrap.cc, mpi_bootstrap.cc) shares.
// Close()'s exchange: not a user channel ('~' is refused by CheckChannel).
inline constexpr std::string_view kCloseChannel = "~close";
// OK, or InvalidArgument for a channel that is not 1 to 64 of [A-Za-z0-9_-].
absl::Status CheckChannel(std::string_view channel);
// OK, or InvalidArgument for size < 1 or rank outside [0, size).
absl::Status CheckRankAndSize(int rank, int size);
// OK, or InvalidArgument for a point-to-point peer outside [0, size) or equal to `rank`
// (Bootstrap::Send, Bootstrap::Receive).
absl::Status CheckPeer(int peer, int rank, int size);
// "rank 2" or "ranks 1, 3": the ranks whose `present` is false.
std::string MissingRanks(const std::vector<bool>& present);
// Now + `seconds`, or none for 0 (or less) and past 1e9 s (wait until aborted).
std::optional<std::chrono::steady_clock::time_point> DeadlineAfter(double seconds);
// OK, or InvalidArgument for a heartbeat timeout that is negative, not finite, or above
// 0 but under 2 s (BootstrapOptions::heartbeat_timeout_seconds).
absl::Status CheckHeartbeatTimeout(double seconds);
// OK, or InvalidArgument for an exchange timeout that is negative or NaN
// (BootstrapOptions::timeout_seconds; 0 and anything past 1e9 s wait until aborted).
absl::Status CheckExchangeTimeout(double seconds);
// A failing rank's reason as the others quote it: one line of at most 1000 bytes.
std::string FailureReason(std::string_view reason);

std::unique_ptr<AllReducer> CreateHostAllReducer(int size, const AllReducerOptions& options = {});

#ifdef PIPESCHED_HAS_CUDA
std::unique_ptr<Transport> CreateCudaPeerTransport();
absl::StatusOr<std::unique_ptr<AllReducer>> CreateNcclAllReducer(
    const std::vector<runtime::Device*>& devices, const AllReducerOptions& options);
#endif

}  // namespace pipesched::comm::internal
