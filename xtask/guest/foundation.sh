# The foundation test: fork / child exit / one byte per page, 4K and 64K mTHP.
. /lib.sh
oracle_setup
run_case fork4k 4K --size ${SIZE:-64M} --thp never --child exit
run_case fork64k 64K --size ${SIZE:-64M} --thp system --child exit
# Shared memory, soft-dirty cleared before the write phase: every write is
# write-notify through wp_page_shared (wp_shared), not COW.
run_case shared4k 4K --size 16M --thp never --shared --clear-soft-dirty
# record -p while a child forked before attach shares the memory; the child
# is killed once faultscope has attached, then the parent writes every page.
run_attach_case attach4k --size 16M --thp never --child exit --child-lifetime 3600
