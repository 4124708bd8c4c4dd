"""llama.cpp's own OpenAI server (llama-cpp-python's `server` extra), loading its model as this plugin
does: `python -m specframe_llamacpp.server ARGS` takes `python -m llama_cpp.server`'s arguments.

The one difference is that the model loads without llama.cpp's extra (repacked) weight buffers, as
`engine.py` loads every model (its docstring says why: on a CPU that reports AMX but does not let a
process use it, the repacked path crashes on the first token, and the server has no option to turn it
off). `specframe serve-bench --peers llamacpp-server` starts this module, so that the load benchmark
measures llama.cpp's server on the same weights and kernels as this plugin's peers.
"""

from __future__ import annotations

import runpy
import sys

from specframe_llamacpp.peers import without_extra_buffers


def main() -> None:
    sys.argv[0] = "llama_cpp.server"
    with without_extra_buffers():
        runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
