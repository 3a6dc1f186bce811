// Whole-file reads and atomic writes. Errors name the path and the OS reason.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pipesched {

// Reads the whole file. NotFound / PermissionDenied / Internal with the path and strerror.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Writes `content` to `path` atomically: a temporary file beside it, fsync, rename.
// A failed write leaves any previous file at `path` untouched. NotFound (no such
// directory), PermissionDenied, InvalidArgument (`path` is a directory) or Internal,
// with the path and strerror.
absl::Status WriteFileAtomic(const std::string& path, std::string_view content);

}  // namespace pipesched
