"""A tokenizer's identity by content, so that two paths to the same files bind as equal (stdlib only).

Both sides name their tokenizer by a path or a hub name (NeMo-RL's ``policy.tokenizer.name``, vLLM's
``model_config.tokenizer``), and the same files often sit at two paths (a checkpoint dir and its
copy on each node). ``tokenizer_identity`` hashes the files that decide which token ids a text
becomes: ``tokenizer.json`` (a fast tokenizer: vocabulary, merges, normalizer, pre-tokenizer,
added tokens), else the slow tokenizer's vocabulary files. A name that is not a local directory
with such files stays the name, and the source says so.

Each file counts by the sha256 of its contents, read in time bounded by
``vocab.limits.MAX_TOKENIZER_HASH_BYTES``: a file in the Hugging Face cache whose blob is named by
its sha256 (a Git LFS file) is not read at all; a file over the limit counts by the sha256 of its
first ``MAX_TOKENIZER_HASH_BYTES`` and its size. A file that is there but cannot be read (a
permission, a FIFO, a directory) gives no identity and a one-line ``unreadable``.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

from nemo_rl_attn_align.vocab.limits import MAX_TOKENIZER_HASH_BYTES, InputRefused, open_regular, shown_path

#: The files hashed, in order of preference: the first group found wins.
TOKENIZER_FILES = (
    ("tokenizer.json",),
    ("tokenizer.model",),
    ("vocab.json", "merges.txt"),
    ("vocab.txt",),
)
#: A Hugging Face cache blob named by the sha256 of its contents (``blobs/<sha256>``: Git LFS files;
#: files kept in Git itself are named by their Git SHA-1, 40 characters, and are read).
_SHA256_BLOB = re.compile(r"[0-9a-f]{64}")


class TokenizerIdentity(NamedTuple):
    """A tokenizer's ``identity`` (``sha256:<hex>`` of its files, the name itself, or None), ``how``
    it was found, and ``unreadable``: one line when a tokenizer file is there but cannot be read."""

    identity: str | None
    how: str
    unreadable: str | None = None


def _recorded_sha256(path: str) -> str | None:
    """The sha256 the Hugging Face cache names ``path``'s contents by (its blob), else None."""
    blob = os.path.realpath(path)
    parent, name = os.path.split(blob)
    in_cache = os.path.basename(parent) == "blobs" and _SHA256_BLOB.fullmatch(name) and os.path.isfile(blob)
    return name if in_cache else None


def file_digest(path: str) -> tuple[str, str]:
    """``(digest, how)`` of one tokenizer file's contents, read in bounded time (see the module).
    Raises ``InputRefused`` for what is not a regular file, ``OSError`` where it cannot be opened."""
    import hashlib  # here: check imports this module for every recipe, most name no local files

    recorded = _recorded_sha256(path)
    if recorded is not None:
        return recorded, "the Hugging Face cache's sha256"
    fd, info = open_regular(path, "tokenizer file")
    try:
        digest, left = hashlib.sha256(), min(info.st_size, MAX_TOKENIZER_HASH_BYTES)
        while left > 0 and (block := os.read(fd, min(left, 1 << 20))):
            digest.update(block)
            left -= len(block)
    finally:
        os.close(fd)
    if info.st_size <= MAX_TOKENIZER_HASH_BYTES:
        return digest.hexdigest(), "sha256"
    return f"{digest.hexdigest()}+{info.st_size}", f"sha256 of the first {MAX_TOKENIZER_HASH_BYTES} bytes, and the size"


def tokenizer_identity(name: str | None) -> TokenizerIdentity:
    """The identity of a tokenizer name or path: ``sha256:<hex>`` of its files for a local directory
    (each file by ``file_digest``), else the name itself (None for no name); ``how`` says which."""
    if not isinstance(name, str) or not name:
        return TokenizerIdentity(None, "no tokenizer name")
    if not os.path.isdir(name):
        return TokenizerIdentity(name, "compared by name (not a local directory)")
    for group in TOKENIZER_FILES:
        paths = [os.path.join(name, file) for file in group]
        if all(os.path.lexists(path) for path in paths):
            import hashlib

            digest, hows = hashlib.sha256(), set()
            for file, path in zip(group, paths, strict=True):
                try:
                    content, how = file_digest(path)
                except InputRefused as err:
                    return _unreadable(str(err))
                except OSError as err:
                    return _unreadable(f"tokenizer file {shown_path(path)} cannot be read ({err.strerror or err})")
                digest.update(f"{file}\0{content}\0".encode())
                hows.add(how)
            return TokenizerIdentity(
                f"sha256:{digest.hexdigest()}", f"{' and '.join(sorted(hows))} of {' + '.join(group)} in {name}"
            )
    return TokenizerIdentity(
        name, f"compared by name ({name} has none of the tokenizer files {', '.join(g[0] for g in TOKENIZER_FILES)})"
    )


def _unreadable(line: str) -> TokenizerIdentity:
    return TokenizerIdentity(None, f"not known: {line}", line)
