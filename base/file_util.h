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

// Whether WriteFileAtomic(path, ...) can succeed, checked before a long run that writes
// it at the end: the directory exists and is writable, and `path` is not a directory.
// InvalidArgument "<flag>=<path>: <what is wrong>; <what would work>" otherwise (`flag`
// as the user typed it, e.g. "--csv").
absl::Status CheckOutputPath(std::string_view flag, const std::string& path);

}  // namespace pipesched
