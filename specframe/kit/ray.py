"""Ray for a plugin's `--ray` option, which spreads a job (a sharded datastore build, say) over a Ray
cluster or over local processes.

- `import_ray(error, instead)` imports ray, or raises `error` saying that `--ray` needs it, how to
  install it and what to do instead: ray is an optional extra (`specframe[ray]`).
- `ray_session(ray, address, num_cpus)` joins the running Ray session, or starts a local one or connects
  to `address` for the block and shuts it down after, as `specframe bench --ray` does; it refuses a
  `num_cpus` below 1, with which Ray's tasks would wait forever.
- `check_ray_cpus(num_cpus, flag)` refuses that up front, before slow work (loading a model).

Imports neither ray nor torch: a plugin may import it at the top of any module.
"""

from specframe.support.ray_support import check_ray_cpus, import_ray, ray_session

__all__ = ["check_ray_cpus", "import_ray", "ray_session"]
