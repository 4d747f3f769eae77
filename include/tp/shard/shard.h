#pragma once
// Everything in tp/shard: split policies, segment plans, head plans. No torch here.
#include "tp/shard/heads.h"
#include "tp/shard/range.h"
#include "tp/shard/segments.h"
#include "tp/shard/shard_mode.h"
#include "tp/shard/split.h"
