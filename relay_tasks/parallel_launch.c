/* relay-tasks' parallel launch for TVM-compiled code.
 *
 * Code TVM compiles runs each parallel loop through TVMBackendParallelLaunch, which hhb-tvm's
 * runtime builds to run every task on the calling thread, so every operator used one core.
 * Loaded ahead of libtvm (see relay_tasks/_parallel.py), these two definitions are the ones
 * libtvm hands to every library it loads: the loop's tasks run on a team of threads, one task
 * a thread, the caller's thread the first of them.
 *
 * Between two loops the team's threads wait busy for a while before they sleep: a sleeping
 * thread wakes through a system call (in a virtual machine, through the hypervisor too), and a
 * model runs hundreds of loops with short gaps between them. Waiting busy is a loss where the
 * process does other work between few loops (a compile folding constants, a tune), and where
 * another process wants the cores: then a thread the system took off its core holds up its
 * whole team, and its busy team-mates take the core from it. So the wait adapts: it is long
 * only after a run of loops in a row, and never for a while after the caller waited for its
 * team far longer than its own task took (a thread was off its core).
 */
#define _GNU_SOURCE
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  void* sync_handle;
  int32_t num_task;
} TVMParallelGroupEnv;

typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv* penv, void* cdata);

/* How long a waiting thread stays busy: in a run of loops on a quiet machine; else. */
#define QUIET_SPIN_NS 2000000ULL
#define BUSY_SPIN_NS 10000ULL
/* A caller that waited this long, and longer than its own task, saw a team-mate off its core;
 * the team then spins briefly for the next BUSY_FOR_NS. */
#define LATE_NS 500000ULL
#define BUSY_FOR_NS 200000000ULL
/* Loops in a row, each within QUIET_SPIN_NS of the last, before a worker waits long. */
#define IN_A_ROW 8
/* The longest a sleeper sleeps before it looks at its word again: should a wake-up ever be
 * lost, its loop is late by this much instead of hung. */
#define NAP_NS 100000000L
#define MAX_TEAM 512

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
}

static void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* A word threads wait on, with the count of those asleep on it (so a waker skips the system
 * call when every waiter is still busy). */
typedef struct {
  atomic_uint value;
  atomic_uint sleepers;
} Word;

static atomic_ullong busy_until; /* now_ns() before which the machine is taken as busy */

/* Loops in a row whose next loop came within QUIET_SPIN_NS. A model's run is hundreds of loops
 * in a row; a compile that folds constants, a test, a Python loop over a few runs are a few
 * loops then a long gap, where a worker waiting busy at the end of each only takes a core
 * another process wants. */
static atomic_uint in_a_row;

static int busy(void) {
  return now_ns() < atomic_load(&busy_until);
}

static void wake(Word* word) {
  if (atomic_load(&word->sleepers) != 0) {
    syscall(SYS_futex, &word->value, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
  }
}

/* Returns once word->value differs from seen, busy for up to budget ns, then asleep. */
static void await_change(Word* word, unsigned seen, uint64_t budget) {
  uint64_t start = 0;
  for (unsigned turn = 1; atomic_load(&word->value) == seen; ++turn) {
    relax();
    if (turn % 64 != 0) {
      continue;
    }
    uint64_t now = now_ns();
    if (start == 0) {
      start = now;
    } else if (now - start > budget) {
      const struct timespec nap = {0, NAP_NS};
      atomic_fetch_add(&word->sleepers, 1);
      while (atomic_load(&word->value) == seen) {
        syscall(SYS_futex, &word->value, FUTEX_WAIT_PRIVATE, seen, &nap, NULL, 0);
      }
      atomic_fetch_sub(&word->sleepers, 1);
      return;
    }
  }
}

/* How long a wait may stay busy: long only in a run of loops, on a quiet machine. */
static uint64_t spin_budget(void) {
  return atomic_load(&in_a_row) >= IN_A_ROW && !busy() ? QUIET_SPIN_NS : BUSY_SPIN_NS;
}

/* A worker's wait for the next loop, counting the loops that come in a row. */
static void await_job(Word* word, unsigned seen) {
  uint64_t started = now_ns();
  await_change(word, seen, spin_budget());
  if (now_ns() - started < QUIET_SPIN_NS) {
    atomic_fetch_add(&in_a_row, 1);
  } else {
    atomic_store(&in_a_row, 0);
  }
}

/* One launch at a time runs on the team; the job it published; the barrier of its tasks. */
static struct {
  pthread_mutex_t lock;
  int workers;
  unsigned first_job;
  FTVMParallelLambda lambda;
  void* cdata;
  int num_task;
  atomic_int failed;
  Word job;     /* counts jobs: workers wait for it to move */
  Word pending; /* workers not done with the job */
  atomic_uint arrived;
  Word phase; /* counts barriers passed */
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Set on a thread running a task: a launch from inside a task runs alone. */
static __thread int in_task;

static void finish(int id, int num_task) {
  if (id < num_task) {
    TVMParallelGroupEnv env = {NULL, num_task};
    if (pool.lambda(id, &env, pool.cdata) != 0) {
      atomic_store(&pool.failed, -1);
    }
  }
  if (atomic_fetch_sub(&pool.pending.value, 1) == 1) {
    wake(&pool.pending);
  }
}

static void* work(void* arg) {
  int id = (int)(intptr_t)arg;
  unsigned seen = pool.first_job;
  in_task = 1;
  for (;;) {
    await_job(&pool.job, seen);
    seen = atomic_load(&pool.job.value); /* the next job waits for every worker: one step */
    finish(id, pool.num_task);
  }
  return NULL;
}

/* A forked child has none of the parent's threads: it starts its own team when it needs one. */
static void forget_team(void) {
  pthread_mutex_init(&pool.lock, NULL);
  pool.workers = 0;
  atomic_store(&pool.pending.value, 0);
  atomic_store(&pool.arrived, 0);
}

__attribute__((constructor)) static void watch_forks(void) {
  pthread_atfork(NULL, NULL, forget_team);
}

/* TVM_NUM_THREADS, as TVM's own runtime reads it; else the processors this process may use. */
static int team_size(void) {
  const char* value = getenv("TVM_NUM_THREADS");
  int wanted = value ? atoi(value) : 0;
  if (wanted <= 0) {
    cpu_set_t cpus;
    wanted = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  }
  return wanted < MAX_TEAM ? wanted : MAX_TEAM;
}

static void start_team(int size) {
  pool.first_job = atomic_load(&pool.job.value);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  while (pool.workers < size - 1) {
    pthread_t thread;
    if (pthread_create(&thread, &attr, work, (void*)(intptr_t)(pool.workers + 1)) != 0) {
      break;
    }
    pool.workers += 1;
  }
  pthread_attr_destroy(&attr);
}

static int alone(FTVMParallelLambda lambda, void* cdata) {
  TVMParallelGroupEnv env = {NULL, 1};
  return lambda(0, &env, cdata);
}

int TVMBackendParallelLaunch(FTVMParallelLambda lambda, void* cdata, int num_task) {
  int size = team_size();
  int threads = num_task > 0 && num_task < size ? num_task : size;
  if (threads <= 1 || in_task || pthread_mutex_trylock(&pool.lock) != 0) {
    return alone(lambda, cdata); /* nested, or another thread's launch holds the team */
  }
  if (pool.workers == 0) {
    start_team(size);
  }
  if (threads > pool.workers + 1) {
    threads = pool.workers + 1;
  }
  if (threads <= 1) {
    pthread_mutex_unlock(&pool.lock);
    return alone(lambda, cdata);
  }
  pool.lambda = lambda;
  pool.cdata = cdata;
  pool.num_task = threads;
  atomic_store(&pool.failed, 0);
  atomic_store(&pool.pending.value, (unsigned)pool.workers);
  /* A worker woken from sleep is late by the system's wake-up, not for want of a core. */
  int asleep = atomic_load(&pool.job.sleepers) != 0;
  atomic_fetch_add(&pool.job.value, 1);
  wake(&pool.job);

  uint64_t started = now_ns();
  in_task = 1;
  TVMParallelGroupEnv env = {NULL, threads};
  if (lambda(0, &env, cdata) != 0) {
    atomic_store(&pool.failed, -1);
  }
  in_task = 0;
  uint64_t own = now_ns() - started;
  /* Team-mates later than the caller's own task took are likelier off their cores than slow:
   * waiting busy longer would hold a core one of them needs. */
  uint64_t patience = spin_budget();
  if (patience > BUSY_SPIN_NS && own < patience) {
    patience = own > BUSY_SPIN_NS ? own : BUSY_SPIN_NS;
  }
  for (unsigned left; (left = atomic_load(&pool.pending.value)) != 0;) {
    await_change(&pool.pending, left, patience);
  }
  uint64_t waited = now_ns() - started - own;
  if (waited > LATE_NS && waited > own && (!asleep || busy())) {
    atomic_store(&busy_until, now_ns() + BUSY_FOR_NS);
  }
  int failed = atomic_load(&pool.failed);
  pthread_mutex_unlock(&pool.lock);
  return failed;
}

int TVMBackendParallelBarrier(int task_id, TVMParallelGroupEnv* penv) {
  (void)task_id;
  unsigned count = (unsigned)penv->num_task;
  if (count <= 1) {
    return 0; /* a task alone: its launch is not the team's */
  }
  unsigned phase = atomic_load(&pool.phase.value);
  if (atomic_fetch_add(&pool.arrived, 1) + 1 == count) {
    atomic_store(&pool.arrived, 0);
    atomic_fetch_add(&pool.phase.value, 1);
    wake(&pool.phase);
  } else {
    await_change(&pool.phase, phase, spin_budget());
  }
  return 0;
}
