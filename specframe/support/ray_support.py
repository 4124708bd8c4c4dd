"""Ray, the optional engine behind `--ray` (sharded datastore builds, bench grids): imported only when
asked for, and a session that is started here is shut down here. `pip install 'specframe[ray]'`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from specframe.terms.errors import ConfigurationError

INSTALL = "pip install 'specframe[ray]'"


def import_ray(error: Callable[[str], Exception], instead: str = ""):
    """The `ray` module, or `error` saying `--ray` needs it, how to install it and, if given, what to do
    `instead`."""
    try:
        import ray
    except ImportError:
        raise error(f"--ray needs Ray, an optional dependency: `{INSTALL}`" + (f"; or {instead}" if instead
                                                                               else "")) from None
    return ray


def check_ray_cpus(num_cpus: int | None, flag: str = "--ray-cpus") -> None:
    """Refuse a CPU count a local Ray instance cannot work with: with no CPU, its tasks (one CPU each)
    would wait forever for one to free up."""
    if num_cpus is not None and (isinstance(num_cpus, bool) or not isinstance(num_cpus, int) or num_cpus < 1):
        raise ConfigurationError(f"ray: {flag} must be a whole number of CPUs >= 1 (a task takes one), got "
                                 f"{num_cpus!r}; pass {flag} 1 or more, or leave it out to use all")


@contextmanager
def ray_session(ray, address: str, num_cpus: int | None, **options) -> Iterator[bool]:
    """Use the running Ray session if there is one (yields False); else start a local instance (`address`
    "local", `num_cpus` CPUs) or connect to the cluster at `address`, yield True and shut it down after."""
    check_ray_cpus(num_cpus)
    if ray.is_initialized():
        yield False
        return
    if address == "local":
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, logging_level="WARNING",
                 **options)
    else:
        ray.init(address=address, logging_level="WARNING", **options)
    try:
        yield True
    finally:
        ray.shutdown()
