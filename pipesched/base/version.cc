#include "pipesched/version.h"

namespace pipesched {

Version GetVersion() {
  return {PIPESCHED_VERSION_MAJOR, PIPESCHED_VERSION_MINOR, PIPESCHED_VERSION_PATCH};
}

const char* VersionString() { return PIPESCHED_VERSION_STRING; }

}  // namespace pipesched
