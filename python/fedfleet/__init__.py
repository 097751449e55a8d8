"""fedfleet from Python: federated training on heterogeneous fleets, simulated on this host or
run for real, with the same C++ engine as the fedfleet command.

    import fedfleet
    run = fedfleet.simulate(fedfleet.Config("examples/configs/sim_mobile_mix.toml", rounds=10),
                            model=my_module)          # an nn.Module; or a built-in name
    run.rounds()                                      # a pandas DataFrame
    net = run.model("best")                           # the trained module

Config holds every key of the TOML file; simulate runs `fedfleet sim`, serve `fedfleet
coordinator`, run_client `fedfleet client` with a Client's own training loop; a Strategy is
your own aggregation rule; History reads any history file; keygen writes CURVE keys.
"""
import warnings as _warnings

from ._core import ConfigError, Error
from ._core import blas_core_advice as _blas_core_advice
from ._core import set_log_level
from ._inputs import ModelError
from .client import Client, EvalResult, FitResult, Task, run_client
from .config import Config
from .history import History, Run
from .serve import Server, keygen, serve
from .simulate import simulate
from .strategy import EvaluateResult, Strategy, Update

__version__ = "0.1.0"
__all__ = ["Client", "Config", "ConfigError", "Error", "EvalResult", "EvaluateResult",
           "FitResult", "History", "ModelError", "Run", "Server", "Strategy", "Task", "Update",
           "keygen", "run_client", "serve", "set_log_level", "simulate"]

# The engine's own log lines (one per round, at info) would repeat what the progress display
# shows: warnings and errors only, unless set_log_level("info") asks for them.
set_log_level("warn")

# OpenBLAS picks its kernels when it loads, from OPENBLAS_CORETYPE or the CPU's model; a model
# it does not know gets kernels without AVX2, several times slower at fp32 products. The
# fedfleet command starts itself again with the variable set; a Python process cannot.
_advice = _blas_core_advice()
if _advice is not None:
    _warnings.warn(
        f"OpenBLAS took this CPU for one without AVX2 and runs its {_advice[0]} kernels: fp32 "
        f"products (linear layers) run several times slower than this CPU can. Start Python "
        f"with OPENBLAS_CORETYPE={_advice[1]} in the environment (the fedfleet command does "
        f"this itself, so its histories can differ from this process's in the last bits).",
        RuntimeWarning, stacklevel=2)
