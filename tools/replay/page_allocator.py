"""The page allocator of the replay's paged KV cache: a free list with reservations.

Pages are handed out in a scattered order on purpose, so block tables look like a
long-running server's rather than 0, 1, 2, ...: the free list starts as a seeded
permutation of the pool, and freed pages go back on top (LIFO), so the next request
reuses what the last finished one held, in reverse order.

A request reserves, when admitted, every page it will ever need (prompt plus all of
its decode tokens) and draws them one by one as its KV grows, so a running request
never finds the pool empty and nothing has to be preempted.
"""

import random


class PageAllocator:
    """Hands out page indices of a pool of `num_pages` pages.

    Parameters
    ----------
    num_pages : int
        Pages in the pool, >= 1.
    seed : int
        Seeds the initial order of the free list.
    """

    def __init__(self, num_pages: int, seed: int = 0):
        if num_pages < 1:
            raise ValueError(f"PageAllocator: num_pages invalid: expected >= 1, got {num_pages}")
        self.num_pages = num_pages
        self._free = list(range(num_pages))
        random.Random(seed).shuffle(self._free)
        self._reserved = {}  # owner -> pages reserved but not yet drawn
        self._owned = {}  # owner -> pages drawn, in drawing order
        self._unreserved = num_pages  # free pages no owner has reserved
        self.peak_pages_in_use = 0

    @property
    def pages_in_use(self) -> int:
        return self.num_pages - len(self._free)

    @property
    def available(self) -> int:
        """Pages a new reservation can still claim."""
        return self._unreserved

    def can_reserve(self, num_pages: int) -> bool:
        return num_pages <= self._unreserved

    def reserve(self, owner, num_pages: int) -> None:
        """Sets aside `num_pages` pages for `owner` (a new owner)."""
        if owner in self._reserved:
            raise ValueError(f"PageAllocator.reserve: owner {owner!r} invalid: expected a new owner, got one holding pages")
        if num_pages < 0 or num_pages > self._unreserved:
            raise ValueError(
                f"PageAllocator.reserve: num_pages invalid: expected 0..{self._unreserved} "
                f"(unreserved pages), got {num_pages}"
            )
        self._unreserved -= num_pages
        self._reserved[owner] = num_pages
        self._owned[owner] = []

    def allocate(self, owner) -> int:
        """Draws one page of `owner`'s reservation; returns its index."""
        if self._reserved.get(owner, 0) < 1:
            raise ValueError(
                f"PageAllocator.allocate: owner {owner!r} has no reserved page left: expected a "
                f"reservation, got {self._reserved.get(owner)!r}"
            )
        self._reserved[owner] -= 1
        page = self._free.pop()
        self._owned[owner].append(page)
        self.peak_pages_in_use = max(self.peak_pages_in_use, self.pages_in_use)
        return page

    def pages_of(self, owner) -> list:
        return list(self._owned[owner])

    def release(self, owner) -> None:
        """Returns `owner`'s pages to the free list and drops what it left unreserved."""
        if owner not in self._owned:
            raise ValueError(f"PageAllocator.release: owner {owner!r} invalid: expected an owner holding a reservation")
        pages = self._owned.pop(owner)
        self._unreserved += self._reserved.pop(owner) + len(pages)
        self._free.extend(pages)
