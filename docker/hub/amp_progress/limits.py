"""How much one learner may send: a cap on the rows kept and on the rate, per learner.

An honest learner checks an exercise every few seconds at most and makes a few hundred attempts in
a whole course; their client sends each attempt once it is made, or a backlog of up to 200 at a
time after an outage. The limits sit far above that and far below a flood: a learner over either
gets 429 and nothing of that post is stored (their client keeps the attempts and tries later).
  MAX_ROWS      attempts kept per learner (the instructor's Clear empties them)
  POSTS         a bucket of POSTS.burst posts, refilled at POSTS.per_second
  RECORDS       the same for records, so a few large posts cannot add thousands of rows at once
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

MAX_ROWS = 2000


@dataclass(frozen=True)
class Rate:
    burst: float
    per_second: float


POSTS = Rate(burst=60, per_second=1.0)
RECORDS = Rate(burst=600, per_second=2.0)


@dataclass
class Bucket:
    rate: Rate
    level: float
    stamp: float

    def take(self, amount: float, now: float) -> float:
        """Take `amount` if the bucket holds it and return 0; else the seconds until it would."""
        self.level = min(self.rate.burst, self.level + (now - self.stamp) * self.rate.per_second)
        self.stamp = now
        if amount <= self.level:
            self.level -= amount
            return 0.0
        return (amount - self.level) / self.rate.per_second


@dataclass
class Limiter:
    """Per-learner buckets of posts and records (in memory: a restart forgives everyone)."""

    posts: Rate = POSTS
    records: Rate = RECORDS
    clock: object = time.monotonic
    _buckets: dict[str, tuple[Bucket, Bucket]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _of(self, user: str, now: float) -> tuple[Bucket, Bucket]:
        if user not in self._buckets:
            self._buckets[user] = (Bucket(self.posts, self.posts.burst, now),
                                   Bucket(self.records, self.records.burst, now))
        return self._buckets[user]

    def post(self, user: str) -> float:
        """One post by `user` arrives: 0 when allowed, else the seconds to wait (a 429)."""
        with self._lock:
            now = self.clock()
            return self._of(user, now)[0].take(1, now)

    def records_of(self, user: str, count: int) -> float:
        """`count` records of a post: 0 when allowed, else the seconds to wait (a 429)."""
        with self._lock:
            now = self.clock()
            return self._of(user, now)[1].take(count, now)
