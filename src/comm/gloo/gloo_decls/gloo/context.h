// Stands in for gloo's own context.h: see declarations.h.
#pragma once
#include "gloo/declarations.h"
