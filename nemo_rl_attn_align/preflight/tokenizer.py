"""A tokenizer's identity by content, so that two paths to the same files bind as equal (stdlib only).

Both sides name their tokenizer by a path or a hub name (NeMo-RL's ``policy.tokenizer.name``, vLLM's
``model_config.tokenizer``), and the same files often sit at two paths (a checkpoint dir and its
copy on each node). ``tokenizer_identity`` hashes the files that decide which token ids a text
becomes: ``tokenizer.json`` (a fast tokenizer: vocabulary, merges, normalizer, pre-tokenizer,
added tokens), else the slow tokenizer's vocabulary files. A name that is not a local directory
with such files stays the name, and the source says so.
"""

from __future__ import annotations

import os

#: The files hashed, in order of preference: the first group found wins.
TOKENIZER_FILES = (
    ("tokenizer.json",),
    ("tokenizer.model",),
    ("vocab.json", "merges.txt"),
    ("vocab.txt",),
)


def tokenizer_identity(name: str | None) -> tuple[str | None, str]:
    """``(identity, how)`` for a tokenizer name or path: ``sha256:<hex>`` of its files for a local
    directory, else the name itself (None for no name); ``how`` says which."""
    if not isinstance(name, str) or not name:
        return None, "no tokenizer name"
    if not os.path.isdir(name):
        return name, "compared by name (not a local directory)"
    for group in TOKENIZER_FILES:
        paths = [os.path.join(name, file) for file in group]
        if all(os.path.isfile(path) for path in paths):
            import hashlib  # here: check imports this module for every recipe, most name no local files

            digest = hashlib.sha256()
            for file, path in zip(group, paths, strict=True):
                digest.update(file.encode() + b"\0")
                with open(path, "rb") as handle:
                    for block in iter(lambda: handle.read(1 << 20), b""):
                        digest.update(block)
            return f"sha256:{digest.hexdigest()}", f"sha256 of {' + '.join(group)} in {name}"
    return name, f"compared by name ({name} has none of the tokenizer files {', '.join(g[0] for g in TOKENIZER_FILES)})"
