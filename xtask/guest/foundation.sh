# The foundation test: fork / child exit / one byte per page, 4K and 64K mTHP.
. /lib.sh
oracle_setup
run_case fork4k 4K --size ${SIZE:-64M} --thp never --child exit
run_case fork64k 64K --size ${SIZE:-64M} --thp system --child exit
