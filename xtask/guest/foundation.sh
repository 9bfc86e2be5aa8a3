# The foundation test: the host tests with the oracle; fork / child exit /
# one byte per page in 64K mTHPs, shared memory, attach, every origin.
. /lib.sh
shipped_binary
oracle_setup
# The host tests named in foundation.rs (HOST_TESTS), against the oracle.
host_tests $HOST_TESTS
run_case fork64k 64K --size ${SIZE:-64M} --thp system --child exit
# Shared memory, soft-dirty cleared before the write phase: every write is
# write-notify through wp_page_shared (wp_shared), not COW.
run_case shared4k 4K --size 16M --thp never --shared --clear-soft-dirty
# record -p while a child forked before attach shares the memory; the child
# is killed once faultscope has attached, then the parent writes every page.
run_attach_case attach4k --size 16M --thp never --child exit --child-lifetime 3600
# Attribution: three mappings of different kinds (an anonymous region, a
# private file mapping, pages added to [heap]), each written after the
# child's exit by a function of its own; the oracle splits its counts by
# their address ranges.
RECORD_ARGS="--sites reuse,copy --stacks reuse,copy --flamegraph /tmp/mappings4k.svg --folded /tmp/mappings4k.folded"
run_case mappings4k 4K --size ${MAPPINGS_SIZE:-4M} --thp never --child exit --mappings --regions-out /tmp/mappings4k.ranges --linger 1
RECORD_ARGS=
emit mappings4k.ranges /tmp/mappings4k.ranges
emit mappings4k.folded /tmp/mappings4k.folded
svg_facts mappings4k /tmp/mappings4k.svg
# Short lives: a process that maps a file (the workload's own binary),
# faults it and exits before faultscope reads its maps, under each
# backend: its mappings are named from the kernel's descriptions.
short_cases
# Every origin of a fault: copies and reuses made by read(2), by
# /proc/self/mem (get_user_pages) and by user stores, under both backends.
origins_cases
# Threads across phase changes: two mappings written alternately by
# several threads, a child killed at half the writes and a second one
# forked and gone at three quarters, recorded with --interval (the kernel's
# per-CPU pending counts flushed and read under them).
storm_cases
# Faults that sleep: a userfaultfd region written by two threads, each
# fault held 2 ms by a handler thread, while a third thread takes
# first-touch faults of its own (the fault state leaves the CPU with the
# sleeping thread and comes back on whichever CPU it wakes).
userfault_cases
