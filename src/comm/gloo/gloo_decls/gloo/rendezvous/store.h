// Stands in for gloo's own rendezvous/store.h: see declarations.h.
#pragma once
#include "gloo/declarations.h"
