"""Train the `small` profile's models on the device machine (one GPU, no Spark, no MLflow) and measure the NLI
recipes: `bench/device_small_models.sh` prepares the carry folder here, the device runs this file.

Why: on this project's 2-core machines the small profile trains for hours (NLI 14-75 min per recipe, PVI ~67 min);
on a lent GPU every recipe trains in a minute or two, so several NLI recipes can be compared on held-out accuracy
per source before one is chosen, and the chosen models come back for the meta-evaluations run here with Spark.
The training code is the project's own (`jobs.training.train_nli.run`, `jobs.training.train_pvi.run`, settings
from conf/ with `--set`-style overrides), unchanged; only what the device lacks is provided:
- pyspark, delta and py4j are not installed there and the training stages never call them (uses_spark=False),
  but platform modules import them at the top: a stub that raises on use stands in (`_stub_spark`);
- the base encoder travels as fp16 (the carry limit is 64 MiB; fp32 MiniLM-L6 is 91 MB) and is widened back to
  fp32 before training: a departure of at most 2^-11 relative per base weight, stated in the results;
- the trained NLI model comes back as fp16 for the same reason (PVI T5s are small enough to return in fp32).

    python bench/device_small_models.py --carry .carry --out $OUT [--budget-s 420]
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import logging
import os
import sys
import tarfile
import time
import types
from pathlib import Path

STUBBED = ("pyspark", "delta", "py4j", "mlflow")


class _Unavailable:
    """Any attribute of a stubbed module: usable in annotations and default arguments, calls return None."""

    def __getattr__(self, name: str) -> _Unavailable:
        return _attribute(name)

    def __call__(self, *args, **kwargs) -> None:
        return None

    def __mro_entries__(self, bases):  # a class deriving from a stubbed one derives from object
        return (object,)


def _attribute(name: str) -> _Unavailable:
    if name.startswith("__"):  # __file__, __spec__ ...: what tools probing sys.modules ask, answered as absent
        raise AttributeError(name)
    return _Unavailable()


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, always: bool) -> None:
        self.always = always

    def find_spec(self, fullname, path, target=None):
        top = fullname.split(".")[0]
        if top in STUBBED and (self.always or importlib.machinery.PathFinder.find_spec(top) is None):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _attribute
        return module

    def exec_module(self, module):
        pass


def _stub_spark(always: bool) -> None:
    if always:  # a dry run here, where they are installed: stub them as on the device
        sys.meta_path.insert(0, _StubFinder(always))
    else:
        sys.meta_path.append(_StubFinder(always))


def _cast(src: Path, dst: Path, dtype: str) -> None:
    """A model folder's floating-point weights -> `dtype` in `dst` (same tensors, same names; the other files
    copied when `dst` is another folder): fp32 -> fp16 for the return trip (64 MiB of files at most), the
    carried fp16 encoder -> fp32 before training."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    if dst != src:
        dst.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            if f.is_file() and f.name != "model.safetensors":
                shutil.copy(f, dst / f.name)
    to = getattr(torch, dtype)
    tensors = {k: v.to(to) if v.is_floating_point() else v for k, v in load_file(src / "model.safetensors").items()}
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})


NLI_RECIPES = {
    # name -> (sources, epochs): the order is the order of importance (the budget may cut the tail).
    "all_2ep": (["sick", "anli_r1", "anli_r2", "anli_r3", "mnli_m", "snli_dev", "joci", "scitail", "cf_snli",
                 "cf_snli_dev"], 2.0),
    "all_3ep": (["sick", "anli_r1", "anli_r2", "anli_r3", "mnli_m", "snli_dev", "joci", "scitail", "cf_snli",
                 "cf_snli_dev"], 3.0),
    "sick_anli_3ep": (["sick", "anli_r1", "anli_r2", "anli_r3"], 3.0),  # today's models/nli-small recipe
    "no_joci_cf_2ep": (["sick", "anli_r1", "anli_r2", "anli_r3", "mnli_m", "snli_dev", "scitail"], 2.0),
}
RETURNED_NLI = "all_2ep"  # the recipe that fits `make models` on 2 cores (projected in the results)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--carry", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/small_models"))
    ap.add_argument("--budget-s", type=float, default=420.0, help="start no optional recipe after this many s")
    ap.add_argument("--smoke", action="store_true", help="a few steps each (a dry run of this script here)")
    ap.add_argument("--stub-always", action="store_true", help="stub Spark and MLflow even where installed")
    a = ap.parse_args()
    started = time.time()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stdout)
    _stub_spark(a.stub_always)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch

    from jobs.infra.config_layers import load_settings
    from jobs.training import train_nli, train_pvi

    results: dict = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
                     "torch": torch.__version__, "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                     "nli": {}, "pvi": {}}
    import transformers

    results["transformers"] = transformers.__version__
    a.out.mkdir(parents=True, exist_ok=True)

    def save_results() -> None:
        results["seconds"] = round(time.time() - started, 1)
        (a.out / "results.json").write_text(json.dumps(results, indent=1))

    base = a.work / "minilm-fp32"
    _cast(a.carry / "minilm", base, "float32")
    data = str((a.carry / "data").resolve())
    smoke = ["train_nli.max_steps=3", "train_nli.eval_batch_size=256"] if a.smoke else []
    pvi_smoke = ["train_pvi.max_steps=3", "train_pvi.max_train_rows=64", "train_pvi.max_dev_rows=16",
                 "train_pvi.epochs=1"] if a.smoke else []
    common = [f"paths.data={data}", "runtime.device=auto", "log.progress_seconds=60"]

    def nli(name: str) -> None:
        use, epochs = NLI_RECIPES[name]
        t0 = time.time()
        s = load_settings(overrides=[*common, f"train_nli.base_model={base}", f"train_nli.use=[{','.join(use)}]",
                                     f"train_nli.epochs={epochs}", f"train_nli.output_dir={a.work}/nli-{name}", *smoke])
        _, summary = train_nli.run(s)
        results["nli"][name] = {"use": use, "epochs": epochs, "train_pairs": summary["train_pairs"],
                                "optimizer_steps": summary["optimizer_steps"], "seconds": round(time.time() - t0, 1),
                                "heldout": summary["heldout"]}
        save_results()

    def pvi(kind: str, extra: list[str]) -> None:
        t0 = time.time()
        s = load_settings(overrides=[*common, "models.profile=small", f"train_pvi.kind={kind}",
                                     f"train_pvi.output_dir={a.work}/pvi-small", *extra, *pvi_smoke])
        _, history = train_pvi.run(s)
        results["pvi"][kind] = {"seconds": round(time.time() - t0, 1), "history": history}
        save_results()

    def ship(folder: Path, name: str) -> None:
        """A model folder -> $OUT/<name>.tar[.NN] pieces of < 16 MiB, written as soon as it is trained, so a run
        cut short by its time limit still returns what it finished (8 files come back at most: 3 + 3 + 2)."""
        bundle = a.work / f"{name}.tar"
        with tarfile.open(bundle, "w") as tar:
            tar.add(folder, arcname=name)
        piece = 16 * 1024 * 1024 - 4096
        with bundle.open("rb") as f:
            for i, chunk in enumerate(iter(lambda: f.read(piece), b"")):
                (a.out / f"{name}.tar.{i:02d}").write_bytes(chunk)
        results.setdefault("shipped", {})[name] = bundle.stat().st_size
        save_results()

    # As `make models` runs them (Makefile): g' selects on dev loss, the information-gain model runs 5 epochs.
    nli(RETURNED_NLI)
    _cast(a.work / f"nli-{RETURNED_NLI}", a.work / f"nli-{RETURNED_NLI}", "float16")
    ship(a.work / f"nli-{RETURNED_NLI}", "nli-small")
    for kind, extra in (("g", []), ("g_null", ["train_pvi.select_on=loss"]), ("info_gain", ["train_pvi.epochs=5"])):
        pvi(kind, extra)
        ship(a.work / "pvi-small" / kind, f"pvi-small-{kind}")
    for name in NLI_RECIPES:
        if name != RETURNED_NLI and time.time() - started < a.budget_s:
            nli(name)
    print(json.dumps({k: v for k, v in results.items() if k != "pvi"}, indent=1))
    print({k: [round(h.get("dev_rouge_l", 0), 3) for h in v["history"]] for k, v in results["pvi"].items()})


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    main()
