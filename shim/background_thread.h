// What the shim's own threads (the planner, the pinning thread) have in common: started with
// every signal blocked, so that signals meant for the job never land on them, and run at a lower
// priority, so that their work never takes the CPU from the threads that feed the GPU.
#pragma once

#include <pthread.h>

namespace delta::shim {

// pthread_create with every signal blocked in the new thread. False when it cannot start.
bool startBackgroundThread(pthread_t* thread, void* (*main)(void*), void* argument);

// Names the calling thread and lowers its priority by 10 nice levels (about a tenth of a CPU
// the job wants).
void becomeBackgroundThread(const char* name);

}  // namespace delta::shim
