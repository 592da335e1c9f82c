// The CUDA emulator's stand-in for the toolkit's header (../emulator.h).
#pragma once
#include "../emulator.h"
