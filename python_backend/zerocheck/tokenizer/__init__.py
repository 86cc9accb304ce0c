"""Tokenizer artifacts: training a byte-level BPE, loading it, streaming detokenization."""
from zerocheck.tokenizer.incremental import IncrementalDetokenizer
from zerocheck.tokenizer.text_tokenizer import TextTokenizer, load_tokenizer
from zerocheck.tokenizer.training import (
    BOS_TOKEN,
    EOS_TOKEN,
    PAD_TOKEN,
    TrainedTokenizer,
    copy_hf_tokenizer,
    describe_hf_tokenizer,
    stdlib_corpus_files,
    train_bpe_tokenizer,
)

__all__ = [
    "BOS_TOKEN",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "IncrementalDetokenizer",
    "TextTokenizer",
    "TrainedTokenizer",
    "copy_hf_tokenizer",
    "describe_hf_tokenizer",
    "load_tokenizer",
    "stdlib_corpus_files",
    "train_bpe_tokenizer",
]
