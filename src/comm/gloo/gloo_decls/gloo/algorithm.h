// Stands in for gloo's own algorithm.h: see declarations.h.
#pragma once
#include "gloo/declarations.h"
