"""The Redis contract, in one place: what the worker, the API, backfill and the CLI may assume
about Redis, and the only code that talks to rankstream's Lua scripts.

    keys.py       the key schema (every key of a board carries its hash tag)
    encoding.py   every encoding: score text, the tie order of zset members (Redis) and of
                  hot-window keys (memory), the "<score>|<tie>" member state
    scripts.py    Lua files under lua/, loaded by SHA, with the constants they share
                  substituted from encoding.py and the wrappers (one source of each number)
    apply.py      apply.lua (+ idwindow.lua): typed requests in, typed outcomes out
    reads.py      top.lua, locate.lua and the count reads the API makes
    advance.py    advance.lua: the consumer group's "applied up to" records
    scan.py       what backfill reads: a window's instances and their members' states
                  (packedpage.lua: a packed window's members by value)

Nothing outside this package builds a script's ARGV or walks a script's raw reply.
"""
