"""Test setup: several CPU devices (for shard_map tests) before JAX starts its backend (this
process's alone: the processes tests start choose their own), and an autotune cache and an XLA
compilation cache of the test run's own (so no user cache is read or written)."""
import os
import shutil
import tempfile

# one cache for the run, shared by pytest-xdist's workers (the cache is safe between processes):
# an op one worker tuned is not timed again by the other
_run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
_cache = (os.path.join(tempfile.gettempdir(), f"paddlejax-tests-{_run}") if _run
          else tempfile.mkdtemp(prefix="paddlejax-tests-"))
os.makedirs(_cache, exist_ok=True)
os.environ["PADDLEJAX_AUTOTUNE_CACHE"] = os.path.join(_cache, "autotune.json")
# and one XLA compilation cache, read by the workers and the processes tests start (scripts,
# notebooks): many tests compile the same small programs (about a fifth of the suite's time)
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(_cache, "xla"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import weakref  # noqa: E402

import pytest  # noqa: E402

from paddlejax.ir import core, parser  # noqa: E402

# Every program a test builds, traces, loads or rewrites must read back from its printed text:
# print -> parse -> print gives the same text (checked when the test ends, on the program as the
# test left it). Programs a test breaks on purpose (dangling values, unknown ops) are those the
# verifier refuses; they are left out.
_PROGRAMS: "weakref.WeakSet[core.Program]" = weakref.WeakSet()
_program_init = core.Program.__init__


def _tracked_init(self, *args, **kwargs):
    _program_init(self, *args, **kwargs)
    _PROGRAMS.add(self)


core.Program.__init__ = _tracked_init


def _round_trip_problem(program: core.Program) -> str | None:
    try:
        text = program.format(locs=True)
    except Exception:  # a program left broken on purpose cannot even print
        return None
    try:
        again = parser.parse(text, params=program.params, constants=program.constants, verify=False)
        if again.format(locs=True) == text:
            return None
        problem = "prints differently after parsing"
    except parser.ParseError as e:
        problem = f"does not parse: {e}"
    try:
        program.verify()
    except Exception:  # the verifier refuses it (VerificationError), or worse: broken on purpose
        return None
    return f"program {program.name!r} {problem}"


@pytest.fixture(autouse=True)
def _programs_read_back_from_their_text():
    _PROGRAMS.clear()
    yield
    problems = [p for p in map(_round_trip_problem, list(_PROGRAMS)) if p]
    _PROGRAMS.clear()
    if problems:
        pytest.fail("print -> parse -> print: " + "; ".join(dict.fromkeys(problems)), pytrace=False)


@pytest.fixture(autouse=True)
def _hub_home_of_its_own(tmp_path_factory, request):
    """Every test gets a hub directory and settings file of its own (never the user's cache),
    and sees no registry from the environment; doctests that set them are undone afterwards.
    (Not through ``monkeypatch``: a test's own patches must be undone before the round-trip
    check above reads its programs.)"""
    base = tmp_path_factory.getbasetemp() / "hub-homes" / request.node.nodeid.replace("/", "_")[-120:]
    names = ("HUB_HOME", "PADDLEJAX_HUB_CONFIG", "PADDLEJAX_HUB_REGISTRY")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(HUB_HOME=str(base / "home"), PADDLEJAX_HUB_CONFIG=str(base / "hub.json"))
    os.environ.pop("PADDLEJAX_HUB_REGISTRY", None)
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def pytest_collection_modifyitems(items):
    """Run the ``slow`` tests first (each group keeps its order): pytest-xdist then hands them
    out while there is plenty else to balance them against, and the run does not end with one
    worker on a minute-long notebook while the other idles."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_unconfigure(config):
    """The process that made the run's caches (the only one, or xdist's controller, whose
    workers inherited the XLA cache's folder) removes them: the XLA cache takes hundreds of MB."""
    if _run is None and not hasattr(config, "workerinput"):
        shutil.rmtree(_cache, ignore_errors=True)
