"""The SQLite plan cache under concurrent writers, threads and processes, and across reopening."""
import multiprocessing as mp
import sqlite3
from concurrent.futures import ThreadPoolExecutor

from cachetile.api.cache import PlanCache


def _write(path, key, doc):
    return PlanCache(path).put(key, doc)


def test_racing_writers_agree_on_one_document(tmp_path):
    path = tmp_path / "sub" / "plans.sqlite"
    with mp.get_context("spawn").Pool(2) as procs:
        from_procs = procs.starmap(_write, [(path, "k", f"process {i}") for i in range(8)])
    with ThreadPoolExecutor(8) as threads:
        from_threads = list(threads.map(lambda i: _write(path, "k", f"thread {i}"), range(32)))
    stored = set(from_procs + from_threads)
    assert len(stored) == 1 and stored.pop().startswith("process ")  # first write wins, everyone sees it
    assert len(PlanCache(path)) == 1


def test_reopened_cache_keeps_documents(tmp_path):
    path = tmp_path / "plans.sqlite"
    cache = PlanCache(path)
    assert not path.exists()  # made on first use
    assert cache.get("a") is None
    cache.put("a", '{"x": 1}')
    assert PlanCache(path).get("a") == '{"x": 1}'
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()
