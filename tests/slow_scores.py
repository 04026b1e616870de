"""spark-submit entry point for fault injection: the nightly pipeline with its first NLI batch slowed down and
announced, so a test can kill a worker mid-scoring (tests/test_cluster.py).

    spark-submit [--py-files receval_spark-*.whl] slow_scores.py MARKER_DIR DELAY_S JOB_ARGS...

It imports nothing but the project's `jobs` package: a test copies it into a folder with no checkout and submits
it beside the wheel. It prints where `jobs` was imported from.
"""

from __future__ import annotations

import sys


def slow_scores(marker_dir: str, delay_s: float, argv: list[str]) -> None:
    """`jobs.receval.pipeline.main` with the NLI model slowed down and announced, so a test can kill a worker mid-scoring.

    Each NLI batch in a Python worker writes `<marker_dir>/<pid>` (the worker whose node the test kills) and
    sleeps before the real model runs; the scores are exactly the pipeline's, so the tables must equal a
    clean run's.
    """
    import jobs.receval.nli_scores as nli_scores
    import jobs.receval.pipeline as pipeline

    real = nli_scores.predictor

    def slow_predictor(*sections):
        make = real(*sections)

        def factory():
            predict = make()

            def slow_predict(premises, hypotheses):
                import os as _os
                import time as _time
                from pathlib import Path as _Path

                # Only the first batch anywhere sleeps (an exclusive claim file): one victim, no slow night.
                try:
                    _os.close(_os.open(_Path(marker_dir, "claimed"), _os.O_CREAT | _os.O_EXCL))
                except FileExistsError:
                    return predict(premises, hypotheses)
                _Path(marker_dir, str(_os.getpid())).touch()
                _time.sleep(delay_s)
                return predict(premises, hypotheses)

            return slow_predict

        return factory

    # nli_scores.plan looks `predictor` up at call time on the driver; the UDF pickles the slow factory.
    nli_scores.predictor = slow_predictor
    pipeline.main(argv)



if __name__ == "__main__":
    import jobs

    print(f"[slow_scores] jobs imported from {jobs.__file__}", flush=True)
    slow_scores(sys.argv[1], float(sys.argv[2]), sys.argv[3:])
