# The foundation test: the host tests with the oracle, then shared memory
# and per-mapping attribution with sites and stacks.
. /lib.sh
shipped_binary
oracle_setup
# The host tests named in foundation.rs, against the oracle.
host_tests
# Shared memory, soft-dirty cleared before the write phase: every write is
# write-notify through wp_page_shared (wp_shared), not COW.
run_case shared4k 4K --size 16M --thp never --shared --clear-soft-dirty
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
