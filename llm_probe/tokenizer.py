"""A character-level tokenizer built offline (``tokenizers`` WordLevel + ``PreTrainedTokenizerFast``).

Every character of ``alphabet`` is one token; ``<pad>``, ``<eos>`` and ``<unk>`` are added. No hub
access: the vocabulary is built in memory and saved with ``save_pretrained``. Load a saved one with
:func:`load_tokenizer` (``PreTrainedTokenizerFast.from_pretrained``, never ``AutoTokenizer``, which can
come back as a Qwen2 tokenizer that drops spaces; measured with transformers 5.24).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["ARITHMETIC_ALPHABET", "PAD", "EOS", "UNK", "build_char_tokenizer", "load_tokenizer"]

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
ARITHMETIC_ALPHABET = "0123456789+=- "
"""Characters of the bundled addition task (digits, '+', '=', '-', space)."""


def build_char_tokenizer(alphabet: str = ARITHMETIC_ALPHABET):
    """A ``PreTrainedTokenizerFast`` with one token per character of ``alphabet`` (+ pad, eos, unk).

    Ids: 0 = <pad>, 1 = <eos>, 2 = <unk>, then the characters in order of first appearance.
    No special tokens are added on encoding (no BOS); padding side is left (generation).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if not isinstance(alphabet, str) or len(alphabet) == 0:
        raise ValueError("alphabet must be a non-empty string")
    chars = list(dict.fromkeys(alphabet))
    vocab = {PAD: 0, EOS: 1, UNK: 2}
    for c in chars:
        vocab[c] = len(vocab)
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token=PAD, eos_token=EOS, unk_token=UNK, padding_side="left"
    )
    return tok


def load_tokenizer(local_dir: str | Path):
    """Load a tokenizer saved with ``save_pretrained`` from a local directory (no download)."""
    from transformers import PreTrainedTokenizerFast

    p = Path(local_dir)
    if not p.is_dir():
        raise ValueError(f"local_dir must be an existing directory, got {str(local_dir)!r}")
    tok = PreTrainedTokenizerFast.from_pretrained(str(p), local_files_only=True)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok
