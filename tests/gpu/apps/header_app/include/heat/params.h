// Found through -Iinclude: the diffusion coefficient and the block size.
#pragma once
#define HEAT_ALPHA 0.2f
#ifndef HEAT_BLOCK
#define HEAT_BLOCK 128
#endif
