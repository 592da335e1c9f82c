// Stands in for gloo's own transport/device.h: see declarations.h.
#pragma once
#include "gloo/declarations.h"
