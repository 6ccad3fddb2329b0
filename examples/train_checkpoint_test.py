#!/usr/bin/env python3
"""ctests of osftrt_train's checkpoints (--save / --resume; issue 52).

  train_checkpoint_test.py TRAINER WORKDIR resume
      Stops a run at steps in every phase (pre-training, full fine-tuning,
      OSFT), AdamW and SOAP, resumes it, and requires every later loss,
      evaluation and final-weights CRC32 to be bit for bit those of the run
      that was never stopped (same --save-every); one resume runs with
      --device staged.
  train_checkpoint_test.py TRAINER WORKDIR kill [--kills 50] [--seed 52]
      Runs the trainer saving at every step and kill -9's it at random
      instants, again and again (a run resumes from the checkpoint the last
      kill left); after every kill the checkpoint must read (--inspect) and a
      resume from a copy of it must finish with the uninterrupted run's
      losses and final weights, bit for bit.
  train_checkpoint_test.py TRAINER WORKDIR bad
      Damaged and mismatched checkpoints (missing, truncated, corrupted
      header, directory or tensor, another format version, a tensor of
      another shape or missing, another rank ratio, optimizer, model size,
      seed or text): each must stop the trainer with exit 1 and a message
      naming the file and the field, before any training step, and leave
      the checkpoint as it was.

Python standard library only. Exit status 0 when every check passed.
"""
import argparse
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import time
import zlib

# A small model and few steps: every run takes a fraction of a second.
FLAGS = ["--pretrain-steps", "10", "--steps", "10", "--batch", "2", "--seq", "16",
         "--context", "4", "--embed", "8", "--inter", "32", "--blocks", "1",
         "--eval-every", "5", "--eval-tokens", "256", "--log-every", "5",
         "--refresh", "3", "--print-losses"]


def with_values(flags, values):
    out = list(flags)
    for name, value in values.items():
        out[out.index(name) + 1] = value
    return out


# The kill test's run: 12 steps, a save after each.
KILL_FLAGS = with_values(FLAGS, {"--pretrain-steps": "4", "--steps": "4",
                                 "--eval-every": "2", "--log-every": "2"})

CKPT = "train.ckpt"
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAILED: " + what, flush=True)
    return ok


def run(trainer, args, timeout=120):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    return subprocess.run([trainer] + args, capture_output=True, text=True, env=env,
                          timeout=timeout)


def bits(stdout):
    """The exact lines: every loss, evaluation and final-weights CRC."""
    return [l for l in stdout.splitlines()
            if l.startswith("loss-bits ") or l.startswith("weights-bits ")]


def results(stdout):
    """The results table without its time and memory columns."""
    rows = [l.split("|")[1:-1] for l in stdout.splitlines()
            if l.startswith("| ") and not l.startswith(("| method", "| ---"))]
    return [[c.strip() for c in r[:5] + r[8:]] for r in rows]


def must_run(trainer, args, what):
    r = run(trainer, args)
    if r.returncode != 0:
        sys.exit("%s: exit %d\n%s\n%s" % (what, r.returncode, r.stdout, r.stderr))
    return r


def step_lines(flags):
    """(label, steps) of the three phases."""
    def value(name):
        return int(flags[flags.index(name) + 1])
    return [("pretrain", value("--pretrain-steps")), ("full-ft", value("--steps")),
            ("osft", value("--steps"))]


def suffix_after(ref, flags, g):
    """The reference's lines after global step g (after its step line and
    its evaluation line, where there is one)."""
    if g == 0:
        return ref
    for label, steps in step_lines(flags):
        if g <= steps:
            i = next(i for i, l in enumerate(ref)
                     if l.startswith("loss-bits %s step %d " % (label, g)))
            if i + 1 < len(ref) and ref[i + 1].startswith("loss-bits %s eval %d " % (label, g)):
                i += 1
            return ref[i + 1:]
        g -= steps
    raise ValueError("global step beyond the run")


def inspect_step(trainer, d, flags):
    """--inspect DIR: (exit status, global step of the checkpoint, output)."""
    r = run(trainer, ["--inspect", d])
    g = None
    for line in r.stdout.splitlines():
        if line.startswith("phase "):
            parts = line.split()
            phase, done = int(parts[1]), int(parts[3])
            g = sum(s for _, s in step_lines(flags)[:phase]) + done
    return r.returncode, g, r.stdout + r.stderr


# ------------------------------------------------------------- resume


def test_resume(trainer, work):
    every = 5
    cases = 0
    for opt in ("soap", "adamw"):
        flags = FLAGS + ["--optimizer", opt, "--save-every", str(every)]
        ref_dir = os.path.join(work, opt, "ref")
        ref_run = must_run(trainer, flags + ["--save", ref_dir], "reference run")
        ref, ref_table = bits(ref_run.stdout), results(ref_run.stdout)
        check(len(ref_table) == 3, "%s: the reference's results table" % opt)
        # 30 steps, 2 evaluations in each fine-tuning, 3 final-weights CRCs
        check(len(ref) == 30 + 4 + 3, "%s: the reference printed %d lines" % (opt, len(ref)))
        total = 30
        for k in range(every, total + 1, every):
            for device in (["cpu"] if opt == "adamw" or k != 25 else ["cpu", "staged"]):
                d = os.path.join(work, opt, "stop%d-%s" % (k, device))
                shutil.rmtree(d, ignore_errors=True)
                first = must_run(trainer, flags + ["--save", d, "--stop-after", str(k)],
                                 "run stopped at %d" % k)
                head = bits(first.stdout)
                check(head == ref[:len(head)], "%s k=%d: lines before the stop differ" % (opt, k))
                rest = must_run(trainer, flags + ["--save", d, "--resume", d,
                                                  "--device", device],
                                "resume from step %d" % k)
                got, want = bits(rest.stdout), suffix_after(ref, flags, k)
                ok = check(got == want and len(want) > 0,
                           "%s k=%d %s: the resumed run's %d lines differ from the "
                           "uninterrupted run's %d" % (opt, k, device, len(got), len(want)))
                ok &= check(results(rest.stdout) == ref_table,
                            "%s k=%d %s: the results table differs:\n%s\n%s" %
                            (opt, k, device, results(rest.stdout), ref_table))
                cases += 1
                print("%-5s stop after step %2d, resume on %-6s: %2d lines %s" %
                      (opt, k, device, len(got), "bitwise equal" if ok else "DIFFER"),
                      flush=True)
    print("resume: %d cases, %d failures" % (cases, len(failures)))


# --------------------------------------------------------------- kill


def test_kill(trainer, work, kills, seed):
    rng = random.Random(seed)
    flags = KILL_FLAGS + ["--save-every", "1"]
    t0 = time.monotonic()
    ref = bits(must_run(trainer, flags + ["--save", os.path.join(work, "ref")],
                        "reference run").stdout)
    run_time = time.monotonic() - t0
    t0 = time.monotonic()
    must_run(trainer, flags + ["--stop-after", "1"], "a run of one step")
    start_time = time.monotonic() - t0  # a run's start (and one step without a save)
    total = sum(s for _, s in step_lines(flags))
    chain = os.path.join(work, "chain")
    tmp = os.path.join(chain, CKPT + ".tmp")
    shutil.rmtree(chain, ignore_errors=True)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    done = unreadable = empty = in_save = bitwise = finished = 0
    g = 0  # steps done at the chain's checkpoint
    while done < kills:
        args = flags + ["--save", chain]
        if os.path.exists(os.path.join(chain, CKPT)):
            args += ["--resume", chain]
        p = subprocess.Popen([trainer] + args, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, env=env)
        # an instant of the run's expected lifetime: its start, then what is
        # left of its steps; every other kill waits from there for a save
        # (its temporary file) and kills inside it
        left = start_time + max(run_time - start_time, 0) * (total - g) / total
        time.sleep(rng.uniform(0, left))
        if done % 2 == 1:
            until = time.monotonic() + left
            while p.poll() is None and not os.path.exists(tmp) and time.monotonic() < until:
                time.sleep(0.0001)
        if p.poll() is not None:  # finished first: start over
            check(p.returncode == 0, "an unkilled run exited %d: %s" %
                  (p.returncode, p.stderr.read().decode()))
            p.stderr.close()
            finished += 1
            shutil.rmtree(chain)
            g = 0
            continue
        p.kill()
        p.wait()
        p.stderr.close()
        done += 1
        in_save += os.path.exists(tmp)
        if not os.path.exists(os.path.join(chain, CKPT)):
            empty += 1  # killed before its first save
            g = 0
            continue
        rc, g, out = inspect_step(trainer, chain, flags)
        if not check(rc == 0 and g is not None, "kill %d: the checkpoint does not read:\n%s"
                     % (done, out)):
            unreadable += 1
            shutil.rmtree(chain)  # start over
            g = 0
            continue
        copy = os.path.join(work, "resume")
        shutil.rmtree(copy, ignore_errors=True)
        os.makedirs(copy)
        shutil.copy(os.path.join(chain, CKPT), copy)
        r = run(trainer, flags + ["--save", copy, "--resume", copy])
        want = suffix_after(ref, flags, g)
        if check(r.returncode == 0 and bits(r.stdout) == want,
                 "kill %d: the resume from step %d of %d does not give the uninterrupted "
                 "run's %d lines (exit %d)\n%s" % (done, g, total, len(want), r.returncode,
                                                  r.stderr)):
            bitwise += 1
    print("kill test: %d kill -9 (half at random instants, half at the first save "
          "after one); %d inside a save (its temporary file left behind), %d before the "
          "first save; %d unreadable checkpoints; %d of %d resumes bitwise equal to the "
          "uninterrupted run; %d runs finished before their kill" %
          (done, in_save, empty, unreadable, bitwise, done - empty, finished))
    check(unreadable == 0 and bitwise == done - empty, "kill test figures")
    check(in_save > 0, "no kill landed inside a save: that case was not tested")


# ---------------------------------------------------------------- bad

HEADER, ENTRY = 64, 128


def entries(blob):
    n, = struct.unpack_from("<I", blob, 12)
    out = {}
    for i in range(n):
        at = HEADER + i * ENTRY
        name = blob[at:at + 80].split(b"\0")[0].decode()
        dtype, ndim, r, c, off, nbytes, crc = struct.unpack_from("<IIQQQQI", blob, at + 80)
        out[name] = dict(at=at, dtype=dtype, ndim=ndim, shape=(r, c), offset=off,
                         bytes=nbytes, crc=crc)
    return out


def reseal(blob):
    """Recomputes the directory and header checksums (a well-formed file
    whose content is wrong)."""
    b = bytearray(blob)
    n, = struct.unpack_from("<I", b, 12)
    struct.pack_into("<I", b, 40, zlib.crc32(bytes(b[HEADER:HEADER + n * ENTRY])))
    struct.pack_into("<I", b, 60, zlib.crc32(bytes(b[:60])))
    return bytes(b)


def flip(blob, at):
    b = bytearray(blob)
    b[at] ^= 0x10
    return bytes(b)


def test_bad(trainer, work):
    flags = FLAGS + ["--save-every", "5"]
    good_dir = os.path.join(work, "good")
    shutil.rmtree(good_dir, ignore_errors=True)
    must_run(trainer, flags + ["--save", good_dir, "--stop-after", "25"], "good checkpoint")
    good = open(os.path.join(good_dir, CKPT), "rb").read()
    e = entries(good)
    # The format as the trainer's source describes it: these checks make
    # the test's reading of it an independent one.
    check(good[:8] == b"OSFTCKPT" and struct.unpack_from("<I", good, 8)[0] == 1, "magic")
    check(struct.unpack_from("<Q", good, 16)[0] == len(good), "file size field")
    check(zlib.crc32(good[:60]) == struct.unpack_from("<I", good, 60)[0], "header CRC32")
    for name, t in e.items():
        check(zlib.crc32(good[t["offset"]:t["offset"] + t["bytes"]]) == t["crc"],
              "CRC32 of " + name)
    for f in ("u_high", "s_high", "v_high", "u_low", "s_low", "v_low"):
        check("osft/block0.mix/" + f in e, "osft/block0.mix/%s present" % f)
    u_high = e["osft/block0.mix/u_high"]
    u_low = e["osft/block0.mix/u_low"]
    r, c = u_low["shape"]

    def with_shape(blob, t, shape):
        b = bytearray(blob)
        struct.pack_into("<QQ", b, t["at"] + 88, *shape)
        return reseal(bytes(b))

    def renamed(blob, t, name):
        b = bytearray(blob)
        b[t["at"]:t["at"] + 80] = name.encode().ljust(80, b"\0")
        return reseal(bytes(b))

    spans = sorted((t["offset"], t["offset"] + t["bytes"]) for t in e.values())
    padding = next(end for (_, end), (start, _) in zip(spans, spans[1:]) if start > end)
    version2 = bytearray(good)
    struct.pack_into("<I", version2, 8, 2)
    data_dir = os.path.join(work, "data")
    shutil.rmtree(data_dir, ignore_errors=True)
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
    shutil.copytree(src, data_dir)
    with open(os.path.join(data_dir, "task_b.txt"), "r+b") as f:
        f.seek(1000)
        ch = f.read(1)
        f.seek(1000)
        f.write(bytes([ch[0] ^ 1]))

    # (name, file content or None for no file, extra flags, wanted message)
    cases = [
        ("missing", None, [], "cannot open (No such file or directory)"),
        ("empty", b"", [], "truncated: 0 bytes, shorter than the 64-byte header"),
        ("truncated-header", good[:40], [], "truncated: 40 bytes"),
        ("truncated-half", good[:len(good) // 2], [],
         "truncated: %d bytes, the header says %d" % (len(good) // 2, len(good))),
        ("truncated-last-byte", good[:-1], [], "truncated"),
        ("trailing", good + b"\0" * 7, [], "trailing bytes"),
        ("magic", b"XSFTCKPT" + good[8:], [], "not an osftrt_train checkpoint"),
        ("header", flip(good, 17), [], "header checksum mismatch"),
        ("version", reseal(bytes(version2)), [], "format version 2; this trainer reads version 1"),
        ("directory", flip(good, u_low["at"] + 3), [], "directory checksum mismatch"),
        ("tensor", flip(good, u_high["offset"] + 5), [],
         "tensor 'osft/block0.mix/u_high' (f32 [%d x %d] at offset %d): checksum mismatch"
         % (u_high["shape"] + (u_high["offset"],))),
        ("padding", flip(good, padding), [], "byte %d (padding, before tensor" % padding),
        ("shape", with_shape(good, u_low, (c, r)), [],
         "tensor 'osft/block0.mix/u_low' is f32 [%d x %d]; this run needs f32 [%d x %d]"
         % (c, r, r, c)),
        ("missing-tensor", renamed(good, e["osft/head/v_low"], "osft/head/v_lox"), [],
         "tensor 'osft/head/v_low' is missing"),
        ("rank-ratio", good, ["--rank-ratio", "0.5"],
         "config/rank_ratio: written by a run with --rank-ratio 0.75, this run has "
         "--rank-ratio 0.5"),
        ("optimizer", good, ["--optimizer", "adamw"],
         "config/optimizer: written by a run with --optimizer soap, this run has "
         "--optimizer adamw"),
        ("model-size", good, ["--embed", "16"],
         "config/embed: written by a run with --embed 8, this run has --embed 16"),
        ("seed", good, ["--seed", "2"], "config/seed: written by a run with --seed 1"),
        ("data", good, ["--data-dir", data_dir], "data/task_b: written for a text of"),
    ]
    for name, content, extra, want in cases:
        d = os.path.join(work, "case-" + name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        path = os.path.join(d, CKPT)
        if content is not None:
            open(path, "wb").write(content)
        if name == "missing":  # what a save killed before its rename leaves
            open(path + ".tmp", "wb").write(good[:1000])
        r = run(trainer, flags + extra + ["--save", d, "--resume", d])
        said = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
        ok = check(r.returncode == 1, "%s: exit %d, not 1" % (name, r.returncode))
        ok &= check(path in said and want in said,
                    "%s: message %r lacks %r or the file's name" % (name, said, want))
        trained = [l for l in r.stdout.splitlines()
                   if l.startswith("loss-bits") or re.match(r"\s+\S+\s+step\s+\d+/", l)]
        ok &= check(not trained, "%s: trained before failing: %s" % (name, trained[:1]))
        if content is not None:
            ok &= check(open(path, "rb").read() == content, "%s: the file changed" % name)
        print("%-20s %s  %s" % (name, "ok  " if ok else "FAIL", said), flush=True)
    # Any single damaged byte or cut is caught (CRC32 finds every error of up
    # to 32 consecutive bits; the padding must be zero), with exit 1, never a
    # crash.
    rng = random.Random(52)
    d = os.path.join(work, "case-random")
    os.makedirs(d, exist_ok=True)
    caught = 0
    damaged = [flip(good, rng.randrange(len(good))) for _ in range(30)]
    damaged += [good[:rng.randrange(len(good))] for _ in range(10)]
    for content in damaged:
        open(os.path.join(d, CKPT), "wb").write(content)
        r = run(trainer, ["--inspect", d])
        caught += check(r.returncode == 1 and "checkpoint " + os.path.join(d, CKPT) in r.stderr,
                        "a damaged file: exit %d, %s" % (r.returncode, r.stderr.strip()))
    print("%d of %d randomly damaged files (30 flipped bytes, 10 cuts) refused" %
          (caught, len(damaged)))
    # --inspect says the same of a damaged file, and reads the good one.
    r = run(trainer, ["--inspect", os.path.join(work, "case-tensor")])
    check(r.returncode == 1 and "checksum mismatch" in r.stderr, "--inspect of a damaged file")
    r = run(trainer, ["--inspect", good_dir])
    check(r.returncode == 0 and "every checksum verified" in r.stdout, "--inspect of a good file")
    print("bad checkpoints: %d cases, %d failures" % (len(cases), len(failures)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trainer")
    ap.add_argument("work")
    ap.add_argument("test", choices=["resume", "kill", "bad"])
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--seed", type=int, default=52)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    t0 = time.monotonic()
    if a.test == "resume":
        test_resume(a.trainer, a.work)
    elif a.test == "kill":
        test_kill(a.trainer, a.work, a.kills, a.seed)
    else:
        test_bad(a.trainer, a.work)
    print("%s: %.1f s, %s" % (a.test, time.monotonic() - t0,
                              "%d FAILED" % len(failures) if failures else "all passed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
