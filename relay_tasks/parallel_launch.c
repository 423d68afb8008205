/* relay-tasks' parallel launch for TVM-compiled code.
 *
 * Code TVM compiles runs each parallel loop through TVMBackendParallelLaunch, which hhb-tvm's
 * runtime builds to run every task on the calling thread, so every operator used one core.
 * Loaded ahead of libtvm (see relay_tasks/_parallel.py), these two definitions are the ones
 * libtvm hands to every library it loads: the loop's tasks run on an OpenMP team, one task a
 * thread, and a barrier is the team's barrier.
 */
#include <stdint.h>
#include <stdlib.h>

typedef struct {
  void* sync_handle;
  int32_t num_task;
} TVMParallelGroupEnv;

typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv* penv, void* cdata);

int omp_get_num_threads(void);
int omp_get_thread_num(void);
int omp_get_max_threads(void);

/* TVM_NUM_THREADS, as TVM's own runtime reads it; else OpenMP's default. */
static int team_size(void) {
  const char* value = getenv("TVM_NUM_THREADS");
  int wanted = value ? atoi(value) : 0;
  return wanted > 0 ? wanted : omp_get_max_threads();
}

int TVMBackendParallelLaunch(FTVMParallelLambda lambda, void* cdata, int num_task) {
  int threads = num_task > 0 ? num_task : team_size();
  int failed = 0;
  if (threads <= 1) {
    TVMParallelGroupEnv alone = {NULL, 1};
    return lambda(0, &alone, cdata);
  }
#pragma omp parallel num_threads(threads)
  {
    /* A nested or limited region may get fewer threads than asked: tasks split by the team. */
    TVMParallelGroupEnv env = {NULL, omp_get_num_threads()};
    if (lambda(omp_get_thread_num(), &env, cdata) != 0) {
#pragma omp atomic write
      failed = -1;
    }
  }
  return failed;
}

int TVMBackendParallelBarrier(int task_id, TVMParallelGroupEnv* penv) {
  (void)task_id;
  (void)penv;
#pragma omp barrier
  return 0;
}
