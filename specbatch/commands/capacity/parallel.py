"""``--tp``: tensor parallelism as a capacity axis ("four TP-1 replicas or one TP-4?").

For each profile the search was given and each tensor-parallel size asked for, the profile of
the same models on the same GPU in the same dtype split over that many GPUs: the profile
itself at its own size, else a shipped profile that matches, else one composed from the given
profile's own ``compose`` command at the new size (into the cache folder; needs the kernel
data, the gpu-data extra), carrying the same fitted engine terms. A measured profile cannot be
re-split (nothing measured it on several GPUs): it is one line saying so. The variants are
then compared like any set of profiles, replicas x GPUs per replica counted in the cost.
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
from pathlib import Path

from sim.errors import InputError

FLAG = "--tp"


def parse_sizes(text: str) -> tuple[int, ...]:
    """``1,2,4`` -> (1, 2, 4): each a GPU count composition can split over (one line otherwise)."""
    from sim.compose.shapes import TP_SIZES

    sizes = []
    for part in (p.strip() for p in text.split(",")):
        if not part.isdigit() or int(part) not in TP_SIZES:
            raise InputError(f"'{part}' is not a tensor-parallel size (one of {', '.join(map(str, TP_SIZES))})",
                             source=FLAG)
        if int(part) in sizes:
            raise InputError(f"{part} is given twice", source=FLAG)
        sizes.append(int(part))
    return tuple(sizes)


def identity(meta: dict) -> tuple:
    """What must match for two profiles to be the same models on the same GPU: target, draft, GPU, dtype."""
    models = meta.get("models") or {}
    gpu = (meta.get("device") or {}).get("gpu") or (meta.get("composition") or {}).get("gpu")
    return (models.get("target", {}).get("name"), (models.get("draft") or {}).get("name"), gpu, meta.get("dtype"))


def variant(profile, size: int) -> str:
    """The name or folder of ``profile`` split over ``size`` GPUs (module docstring)."""
    from sim.costmodel.profile import load_profile, shipped_profiles

    if profile.gpus_per_replica == size:
        return str(profile.path)
    wanted = identity(profile.meta)
    for name in shipped_profiles():
        meta = load_profile(name).meta
        if identity(meta) == wanted and int(meta.get("tensor_parallel_size", 1)) == size:
            return name
    command = profile.meta.get("command", "")
    if profile.meta.get("source") != "composed" or not command.startswith("specbatch compose "):
        raise InputError(f"profile {profile.name} is measured (a replica of {profile.gpus_per_replica} device(s)) and "
                         f"no shipped profile has its models on {size} GPUs; compose one (specbatch compose ... "
                         f"--tp {size}) and compare them with --profiles", source=FLAG)
    return str(compose_variant(profile, command, size))


def compose_variant(profile, command: str, size: int) -> Path:
    """Compose ``profile``'s command at ``size`` GPUs into the cache folder (a few seconds; composed again
    each time, so it is never a stale composition)."""
    from sim.costmodel.cache import cache_dir
    from specbatch.commands import compose
    from specbatch.commands.fit import carry_terms
    from sim.compose import compose as write
    from sim.costmodel.profile import load_profile

    words = command.split()[2:]
    # the new split's own placement and folder; its drafting is the draft model's (heads are composed on one
    # GPU only, and host proposers would be timed again)
    for flag in ("--out", "--tp", "--draft-tp", "--name", "--drafters"):
        while flag in words:
            at = words.index(flag)
            del words[at:at + 2]
    key = hashlib.sha256(" ".join(words + [str(size)]).encode()).hexdigest()[:12]
    root = cache_dir()
    parent = root / "composed" / key if root is not None else Path(tempfile.mkdtemp(prefix="specbatch-tp-"))
    folder = parent / f"{profile.name}-tp{size}"  # the folder's name is the profile's
    parser = argparse.ArgumentParser()
    compose.add_arguments(parser)
    args = parser.parse_args(words + ["--tp", str(size), "--out", str(folder)])
    try:
        write(compose.build_request(args), folder)
    except InputError as exc:
        raise InputError(f"composing {profile.name} on {size} GPUs: {exc.message}", source=FLAG) from None
    overhead = profile.meta.get("engine_overhead", {})
    donor = None  # the same serving stack's fitted terms, as the given profile has them
    if overhead.get("fitted"):
        donor, terms = str(profile.path), overhead["fitted"]["terms"]
    elif overhead.get("carried"):
        donor, terms = overhead["carried"]["from"], overhead["carried"]["terms"]
    if donor is not None:
        carry_terms(str(folder), donor, str(folder), tuple(terms))
    load_profile(folder)
    return folder
