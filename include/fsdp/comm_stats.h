// Per-rank communication time of FSDP units.
#pragma once

namespace fsdp {

struct CommStats {
  // Seconds the training thread waited for collectives since the units were created: the
  // communication that compute did not hide (exposed communication).
  double exposed_seconds = 0;
};

}  // namespace fsdp
