# One boot of `cargo xtask ab`: each bench of $BENCHES (separated by ';')
# as a series of $RUNS runs on $SIZE; each series' text and JSON printed.
. /lib.sh
case "$BENCHES" in *hotpatch*) hotpatch_dir $SIZE ;; esac
i=0
IFS=';'
set -f
for args in $BENCHES; do
	i=$((i + 1))
	IFS=' '
	/faultscope bench $args --runs $RUNS --size $SIZE --json /tmp/ab$i.json > /tmp/ab$i.out 2>&1
	echo "@@FS-RC ab$i $?"
	IFS=';'
	emit ab$i.out /tmp/ab$i.out
	emit ab$i.json /tmp/ab$i.json
done
echo "@@FS-AB-BENCHES $i"
