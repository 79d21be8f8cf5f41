#include "kernels/ptr.h"

#include "util/error.h"

namespace wiola {

void dtype_mismatch(DType have, DType want) {
  fail("op argument holds ", dtype_name(have), " but the op reads it as ", dtype_name(want),
       " (this backend has no such mixed-precision storage)");
}

}  // namespace wiola
