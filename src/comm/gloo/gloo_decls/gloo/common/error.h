// Stands in for gloo's own common/error.h: see declarations.h.
#pragma once
#include "gloo/declarations.h"
