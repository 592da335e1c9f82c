#!/usr/bin/env python3
"""Runs a GoogleTest binary so that one test that takes the process down (a crash, an abort)
does not take the tests after it with it: when the process dies mid-test, the tests it had not
reached run again in a new process, the crashed one left out, until every selected test ran once.

  gtest_isolated.py LOG BINARY [--gtest_filter=POSITIVE[-NEGATIVE]] [other gtest flags]

The output of every round is printed and appended to LOG; the last line is the verdict, as
"gtest_isolated: 12 passed, 1 failed, 0 skipped, 1 crashed (Suite.Name)". Exit status 0 when
every selected test passed or skipped, 1 otherwise.
"""
import re
import subprocess
import sys

RUN = re.compile(r"^\[ RUN      \] (\S+)")
END = re.compile(r"^\[ +(OK|FAILED|SKIPPED) +\] (\S+) \(")
FINISHED = re.compile(r"^\[==========\] \d+ tests? from \d+ test suites? ran")


def split_filter(args):
    """(positive, negatives, other args) of a gtest command line's --gtest_filter."""
    positive, negatives, rest = "*", [], []
    for arg in args:
        if arg.startswith("--gtest_filter="):
            spec = arg.split("=", 1)[1]
            positive, _, negative = spec.partition("-")
            positive = positive or "*"
            negatives = [n for n in negative.split(":") if n]
        else:
            rest.append(arg)
    return positive, negatives, rest


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    log_path, binary = sys.argv[1], sys.argv[2]
    positive, negatives, rest = split_filter(sys.argv[3:])
    results, crashed = {}, []
    with open(log_path, "w") as log:
        for _ in range(100):  # more rounds than any suite has crashing tests
            spec = positive + ("-" + ":".join(negatives) if negatives else "")
            proc = subprocess.Popen([binary, f"--gtest_filter={spec}"] + rest,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    errors="replace")
            running, finished = None, False
            for line in proc.stdout:
                sys.stdout.write(line)
                log.write(line)
                if m := RUN.match(line):
                    running = m.group(1)
                elif m := END.match(line):
                    results[m.group(2)] = m.group(1)
                    negatives.append(m.group(2))
                    running = None
                elif FINISHED.match(line):
                    finished = True
            rc = proc.wait()
            sys.stdout.flush()
            if finished or running is None:
                if not finished and rc != 0:
                    crashed.append(f"(the process, exit {rc}, outside any test)")
                break
            crashed.append(running)
            negatives.append(running)
            note = f"gtest_isolated: {running} took the process down (exit {rc}); the rest runs again\n"
            sys.stdout.write(note)
            log.write(note)
        counts = {k: sum(1 for v in results.values() if v == k) for k in ("OK", "FAILED", "SKIPPED")}
        verdict = (f"gtest_isolated: {counts['OK']} passed, {counts['FAILED']} failed, "
                   f"{counts['SKIPPED']} skipped, {len(crashed)} crashed"
                   + (f" ({', '.join(crashed)})" if crashed else ""))
        print(verdict)
        log.write(verdict + "\n")
    sys.exit(0 if counts["FAILED"] == 0 and not crashed else 1)


if __name__ == "__main__":
    main()
