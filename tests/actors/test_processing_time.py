"""Processing time on an actor's event loop: one alarm, timers delivered as mails in order."""

from __future__ import annotations

import asyncio

from actorflow.actors.processing_time import AsyncioProcessingTimeService
from actorflow.operators import MailboxProcessor, SystemClock


def test_timers_fire_as_mails_in_timestamp_order_and_cancelled_ones_never_run():
    async def scenario() -> list[str]:
        fired: list[str] = []
        processor = MailboxProcessor(lambda controller: controller.suspend_default_action())
        processor.mailbox.bind_to_current_thread()
        clock = SystemClock()
        service = AsyncioProcessingTimeService(asyncio.get_running_loop(), processor.executor(0), clock)
        now = clock.now_ms()
        service.register_timer(now + 60, lambda ts: fired.append("late"))
        service.register_timer(now + 20, lambda ts: fired.append("early"))  # moves the alarm forward
        cancelled = service.register_timer(now + 40, lambda ts: fired.append("cancelled"))
        service.register_timer(now - 5, lambda ts: fired.append("overdue"))
        cancelled.cancel()
        loop_task = asyncio.get_running_loop().create_task(processor.run_mailbox_loop_async())
        while len(fired) < 3:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)  # the cancelled timer's time has passed too
        processor.executor(0).execute(processor.all_actions_completed, "stop")
        await loop_task
        assert service.pending() == 0
        return fired

    assert asyncio.run(scenario()) == ["overdue", "early", "late"]
