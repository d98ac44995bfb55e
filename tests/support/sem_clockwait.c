/* libfaketime (0.9.10) fakes CLOCK_MONOTONIC but does not wrap sem_clockwait(), which Python 3.11's locks use for
   every wait with a timeout (Queue.get, Event.wait, Condition.wait): the deadline is a faked monotonic time that the
   real call reads as real, so a +40 s process waits 40 s more and a -40 s one spins. This wraps it: the time left,
   read on the faked clock, becomes a realtime deadline on the faked clock, which libfaketime's sem_timedwait
   turns into a real one. Preloaded before libfaketime (tests/support/faketime.py). */
#define _GNU_SOURCE
#include <semaphore.h>
#include <time.h>

int sem_clockwait(sem_t *sem, clockid_t clock, const struct timespec *abstime) {
    struct timespec now, realtime;
    clock_gettime(clock, &now);
    clock_gettime(CLOCK_REALTIME, &realtime);
    long long left = (abstime->tv_sec - now.tv_sec) * 1000000000LL + (abstime->tv_nsec - now.tv_nsec);
    if (left < 0) left = 0;
    long long at = realtime.tv_sec * 1000000000LL + realtime.tv_nsec + left;
    struct timespec deadline = {at / 1000000000LL, at % 1000000000LL};
    return sem_timedwait(sem, &deadline);
}
