"""Temporary folders the reference checks write into, removed when the process exits.

A check's scratch (a tokenizer check extracts about 90 MB from llama-cpp-python's source
release) must not stay behind in /tmp after every ctest run: on a shared CI machine that filled
the disk a run at a time. KEEP_TMP=1 keeps them, to look at what a failing check wrote."""
import atexit, os, shutil, tempfile


def scratch_dir(prefix):
    """A new folder under the system's temporary directory, removed at exit (unless KEEP_TMP)."""
    path = tempfile.mkdtemp(prefix=prefix)
    if not os.environ.get("KEEP_TMP"):
        atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path
