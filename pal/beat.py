"""The scheduler of `celery -A pal beat` (CELERY_BEAT_SCHEDULER). Nothing imports this module but beat itself: it
reaches into the engine, which imports the Celery app."""

from celery.beat import PersistentScheduler


class Scheduler(PersistentScheduler):
    """`celery -A pal beat`'s scheduler (CELERY_BEAT_SCHEDULER): the schedule's entries as usual, and between them
    the recovery look (runs.recovery.RecoveryLook), which sends a sweep as soon as a lease expires or a timer comes
    due, by the database's clock. In the beat, not in a countdown message that a worker holds: the death of a
    worker cannot take the early sweep with it."""

    def tick(self, *args, **kwargs):
        left = super().tick(*args, **kwargs)
        look = getattr(self, "_look", None)
        if look is None:
            import django

            django.setup()  # idempotent; the engine's modules need the apps, which beat has not loaded yet
            from runs.recovery import RecoveryLook  # the engine's models load only once Django is set up

            look = self._look = RecoveryLook()
        return min(left, look.tick())
