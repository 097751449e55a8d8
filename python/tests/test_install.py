"""The package as `cmake --install build --component python` lays it out imports on its own."""
import os
import subprocess
import sys

import pytest


def test_the_installed_package_imports_outside_the_build_tree(tmp_path):
    build = os.environ.get("FEDFLEET_BUILD_DIR")
    if not build:
        pytest.fail("FEDFLEET_BUILD_DIR (this build's directory) is not set; run through ctest")
    dest = tmp_path / "dest"
    subprocess.run(["cmake", "--install", build, "--component", "python"], check=True,
                   env=dict(os.environ, DESTDIR=str(dest)), capture_output=True)
    site = [os.path.join(root, "fedfleet") for root, dirs, _ in os.walk(dest)
            if "fedfleet" in dirs]
    assert len(site) == 1, site
    assert site[0].endswith("dist-packages/fedfleet")
    names = set(os.listdir(site[0]))
    assert {"__init__.py", "models.py", "config.py", "history.py"} <= names
    assert any(n.startswith("_core.") and n.endswith(".so") for n in names)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.path.dirname(site[0])
    p = subprocess.run([sys.executable, "-c",
                        "import fedfleet, fedfleet.models; print(fedfleet.__file__); "
                        "print(fedfleet.Config(rounds=3)['run.rounds'])"],
                       cwd=tmp_path, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    where, rounds = p.stdout.split()
    assert where.startswith(str(dest))
    assert rounds == "3"
