"""own_prompt.py over SGLang's real RadixCache (CPU, no pools): which prompt pages a request
alone holds, and what moving its lock up leaves in the tree."""

import torch
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

from sglang_zipage.own_prompt import kind, own_start


def tree(disable=False):
    return RadixCache(CacheInitParams(disable=disable, req_to_token_pool=None,
                                      token_to_kv_pool_allocator=None, page_size=1))


def cached(t, ids, first_slot):
    """Insert a prompt as a prefill does and return its last node (unlocked)."""
    t.insert(InsertParams(key=RadixKey(ids), value=torch.arange(first_slot, first_slot + len(ids))))
    return t.match_prefix(MatchPrefixParams(key=RadixKey(ids))).last_device_node


def test_a_request_owns_what_follows_the_prefix_others_hold():
    t = tree()
    cached(t, list(range(100)), 0)
    b = cached(t, list(range(60)) + list(range(500, 540)), 100)  # shares 60 tokens with a
    a = cached(t, list(range(100)), 0)  # b's insert split a's node at 60: its last node now
    t.inc_lock_ref(a)
    # alone: its whole prompt is its own
    assert own_start(a, 100, t.root_node) == (0, t.root_node)
    t.inc_lock_ref(b)
    start, node = own_start(a, 100, t.root_node)
    assert start == 60 and node is a.parent and node.lock_ref == 2
    # a moves its lock up to the shared node: its 40 tokens stay cached, evictable
    t.dec_lock_ref(a)
    t.inc_lock_ref(node)
    assert (t.evictable_size(), t.protected_size()) == (40, 100)
    assert t.match_prefix(MatchPrefixParams(key=RadixKey(list(range(100))))).device_indices.numel() == 100


def test_which_caches_copy_the_prompt():
    assert kind(tree()) == "radix"
    assert kind(tree(disable=True)) == "own"  # no tree: the prompt is the request's already
