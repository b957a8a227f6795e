"""Tests of the page allocator: scattered order, LIFO reuse, reservations, misuse errors."""

import sys

import pytest

from tools.replay.page_allocator import PageAllocator


def test_scattered_and_deterministic():
    a, b = PageAllocator(64, seed=3), PageAllocator(64, seed=3)
    a.reserve("r", 8)
    b.reserve("r", 8)
    pages = [a.allocate("r") for _ in range(8)]
    assert pages == [b.allocate("r") for _ in range(8)]
    assert pages != list(range(8)) and pages != sorted(pages)
    assert len(set(pages)) == 8 and all(0 <= p < 64 for p in pages)
    other = PageAllocator(64, seed=4)
    other.reserve("r", 8)
    assert [other.allocate("r") for _ in range(8)] != pages


def test_freed_pages_reused_last_in_first_out():
    alloc = PageAllocator(16, seed=0)
    alloc.reserve("a", 3)
    held = [alloc.allocate("a") for _ in range(3)]
    alloc.release("a")
    alloc.reserve("b", 3)
    assert [alloc.allocate("b") for _ in range(3)] == held[::-1]


def test_pages_never_shared_and_accounting():
    alloc = PageAllocator(10, seed=1)
    alloc.reserve("a", 6)
    alloc.reserve("b", 4)
    assert alloc.available == 0 and not alloc.can_reserve(1) and alloc.can_reserve(0)
    a = [alloc.allocate("a") for _ in range(5)]
    b = [alloc.allocate("b") for _ in range(4)]
    assert sorted(a + b) == sorted(set(a + b))
    assert alloc.pages_in_use == 9 and alloc.peak_pages_in_use == 9
    assert alloc.pages_of("a") == a
    alloc.release("a")  # 5 drawn + 1 still reserved come back
    assert alloc.available == 6 and alloc.pages_in_use == 4 and alloc.peak_pages_in_use == 9
    alloc.release("b")
    assert alloc.available == 10 and alloc.pages_in_use == 0


def test_misuse_errors():
    alloc = PageAllocator(4, seed=0)
    with pytest.raises(ValueError, match=r"reserve: num_pages invalid: expected 0..4 \(unreserved pages\), got 5"):
        alloc.reserve("a", 5)
    alloc.reserve("a", 1)
    with pytest.raises(ValueError, match="expected a new owner"):
        alloc.reserve("a", 1)
    alloc.allocate("a")
    with pytest.raises(ValueError, match="owner 'a' has no reserved page left"):
        alloc.allocate("a")
    with pytest.raises(ValueError, match="owner 'z' has no reserved page left"):
        alloc.allocate("z")
    alloc.release("a")
    with pytest.raises(ValueError, match="release: owner 'a' invalid"):
        alloc.release("a")
    with pytest.raises(ValueError, match="num_pages invalid: expected >= 1, got 0"):
        PageAllocator(0)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
