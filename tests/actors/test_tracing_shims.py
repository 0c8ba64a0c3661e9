"""An actor's calls between its own methods skip the tracing shims Ray puts around every method."""

from __future__ import annotations

import ray

from actorflow.actors.upstream.ray import bind_private_methods


class Counter:
    def __init__(self, bind: bool) -> None:
        if bind:
            bind_private_methods(self)
        self.count = 0

    def _step(self) -> int:
        self.count += 1
        return self.count

    async def _later(self) -> int:
        return self._step()

    async def report(self) -> dict:
        step, later = type(self)._step, type(self)._later
        return {
            # Ray wrapped the class's methods, private ones too: the premise.
            "class_wrapped": hasattr(step, "__wrapped__") and hasattr(later, "__wrapped__"),
            "instance_plain": self._step.__func__ is getattr(step, "__wrapped__", step)
            and self._later.__func__ is getattr(later, "__wrapped__", later),
            "steps": [self._step(), await self._later()],
        }


def test_private_methods_of_an_actor_are_its_own_functions_and_still_work(ray_session):
    plain = ray.remote(Counter).remote(True)
    assert ray.get(plain.report.remote()) == {"class_wrapped": True, "instance_plain": True, "steps": [1, 2]}
    # Without binding, the instance calls Ray's wrappers: what the binding takes away.
    wrapped = ray.remote(Counter).remote(False)
    assert ray.get(wrapped.report.remote()) == {"class_wrapped": True, "instance_plain": False, "steps": [1, 2]}


def test_a_class_that_ray_did_not_wrap_is_left_as_it_is():
    counter = Counter(True)
    assert "_step" not in vars(counter) and counter._step() == 1
