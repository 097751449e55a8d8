"""What a Python caller hands fedfleet, turned into what a configuration names: an nn.Module into
a TorchScript file, tensors or a torch Dataset into a tensors data file (`torch.save({"x": X,
"y": Y})`, data.format = "tensors"). The files go into a folder beside the history, named by a
hash of their bytes: the history's configuration names them, so that `fedfleet model export`,
History.model() and a resume (which must see the same configuration) find them again."""
from __future__ import annotations

import hashlib
import inspect
import io
import math
import os
import textwrap
import zipfile
from typing import Any, Optional, Tuple

from ._core import ConfigError

# The most a torch Dataset may hold when simulate() materialises it (x and y together).
MAX_DATASET_BYTES = 4 << 30


class ModelError(ConfigError):
    """A model fedfleet cannot run: an nn.Module that TorchScript cannot compile."""


def _write_by_hash(folder: str, stem: str, data: bytes, digest: Optional[str] = None) -> str:
    """Writes `data` to FOLDER/STEM-HASH.pt (once: an equal file is kept); its path. HASH is
    `digest`, or the SHA-256 of the bytes."""
    digest = (digest or hashlib.sha256(data).hexdigest())[:16]
    path = os.path.join(folder, f"{stem}-{digest}.pt")
    if not os.path.exists(path):
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    return path


def script_module(model: Any):
    """An nn.Module as a ScriptModule (a ScriptModule as it is). Raises ModelError naming what
    TorchScript could not compile, and how to go on."""
    import torch

    if isinstance(model, torch.jit.ScriptModule):
        return model
    if not isinstance(model, torch.nn.Module):
        raise ModelError(f"model: a {type(model).__name__} is neither an nn.Module, a "
                         "ScriptModule nor a built-in model name (logreg, mlp, cnn, lenet)")
    try:
        return torch.jit.script(model)
    except Exception as e:  # TorchScript's errors have several types; all say what failed
        said = str(e).strip()
        name = type(model).__name__
        if 'File "' not in said:
            # Some refusals (a numpy call, an object TorchScript cannot reference) come without
            # the source line: name the method it was compiling.
            try:
                where = inspect.getsourcefile(type(model))
                line = inspect.getsourcelines(type(model).forward)[1]
                said += f"\n(while compiling {name}.forward, {where}:{line})"
            except (OSError, TypeError):
                pass
        if "could not get source code" in said:
            fix = ("TorchScript compiles a module from its class's source code, which Python "
                   "could not find: define the class in a file or a notebook cell, not in "
                   "`python -c` or exec()")
        else:
            fix = ("rewrite the construct it names in TorchScript's subset of Python (annotate "
                   "types, no **kwargs, no numpy or other Python-only libraries in forward), or "
                   "script the model yourself (torch.jit.script) and pass the ScriptModule")
        raise ModelError(
            f"model: TorchScript cannot compile {name}, which fedfleet needs to run it in C++ "
            f"(every client and the coordinator load the scripted module). TorchScript said:\n"
            f"{textwrap.indent(said, '    ')}\nFix: {fix}.") from e


def _torchscript_digest(archive: bytes) -> str:
    """A hash of a TorchScript archive that is the same for the same module scripted in another
    process: TorchScript writes a class's constants in set order, which Python's hash
    randomisation changes from run to run, so the lines of each code file are hashed sorted."""
    h = hashlib.sha256()
    with zipfile.ZipFile(io.BytesIO(archive)) as z:
        for name in sorted(z.namelist()):
            content = z.read(name)
            if name.endswith(".py"):
                content = b"\n".join(sorted(content.splitlines()))
            h.update(name.encode() + b"\0" + hashlib.sha256(content).digest())
    return h.hexdigest()


def model_file(model: Any, folder: str) -> str:
    """Saves the model as TorchScript into `folder`; its path."""
    import torch

    scripted = script_module(model)
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    archive = buffer.getvalue()
    return _write_by_hash(folder, "model", archive, _torchscript_digest(archive))


def _as_tensors(data: Any, what: str, max_bytes: int) -> Tuple[Any, Any]:
    """(x, y) from a pair of tensors (or arrays) or a torch Dataset of (x, y) samples."""
    import torch

    if isinstance(data, (tuple, list)) and len(data) == 2:
        x, y = (torch.as_tensor(v) for v in data)
    elif isinstance(data, torch.utils.data.Dataset):
        if not hasattr(data, "__len__"):
            raise ConfigError(f"{what}: an iterable Dataset without len(); give (x, y) tensors")
        n = len(data)
        if n == 0:
            raise ConfigError(f"{what}: the Dataset is empty")
        x0, y0 = data[0]
        x0, y0 = torch.as_tensor(x0), torch.as_tensor(y0)
        need = n * (x0.numel() * x0.element_size() + y0.numel() * y0.element_size())
        if need > max_bytes:
            raise ConfigError(
                f"{what}: the Dataset's {n} samples of shape {tuple(x0.shape)} would take "
                f"{need / 2**30:.1f} GiB in memory, more than the {max_bytes / 2**30:.1f} GiB "
                "simulate() materialises; save it as a data file (data.format tensors, csv, idx "
                "or image-folder) and name it in the config, or raise max_dataset_bytes")
        xs, ys = [x0], [y0]
        for i in range(1, n):
            xi, yi = data[i]
            xs.append(torch.as_tensor(xi))
            ys.append(torch.as_tensor(yi))
        x, y = torch.stack(xs), torch.stack(ys)
    else:
        raise ConfigError(f"{what}: give (x, y) tensors or a torch Dataset, not a "
                          f"{type(data).__name__}")
    if x.shape[0] != y.shape[0]:
        raise ConfigError(f"{what}: x has {x.shape[0]} samples and y {y.shape[0]}")
    if not y.is_floating_point():
        y = y.to(torch.int64)  # class labels (the tensors format's integer y)
    if not x.is_floating_point():
        x = x.to(torch.float32)
    return x.contiguous(), y.contiguous()


def data_file(data: Any, what: str, folder: str, max_bytes: int = MAX_DATASET_BYTES) -> str:
    """Saves the data as a tensors file into `folder`; its path."""
    import torch

    x, y = _as_tensors(data, what, max_bytes)
    buffer = io.BytesIO()
    torch.save({"x": x, "y": y}, buffer)
    return _write_by_hash(folder, what, buffer.getvalue())


def apply_inputs(cfg, folder: str, model: Any = None, train: Any = None, test: Any = None,
                 max_dataset_bytes: int = MAX_DATASET_BYTES) -> None:
    """Points the config at the model and data given (files written into `folder`)."""
    if model is not None:
        if isinstance(model, str):
            cfg["model.name"] = model
        else:
            os.makedirs(folder, exist_ok=True)
            cfg["model.name"] = "torchscript"
            cfg["model.path"] = os.path.abspath(model_file(model, folder))
    if train is not None or test is not None:
        os.makedirs(folder, exist_ok=True)
        cfg["data.format"] = "tensors"
        if train is not None:
            cfg["data.path"] = os.path.abspath(data_file(train, "train", folder,
                                                         max_dataset_bytes))
        if test is not None:
            cfg["data.test_path"] = os.path.abspath(data_file(test, "test", folder,
                                                              max_dataset_bytes))
