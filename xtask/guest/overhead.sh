# Tracer overhead: the same bench with the tracer off and on, alternately,
. /lib.sh
# in one boot, so that the ratio is taken under the same conditions.
for i in $(seq ${RUNS:-5}); do
	for t in off on; do
		flag=; [ $t = off ] && flag=--no-trace
		/faultscope bench seq --size ${SIZE:-64M} --folio ${FOLIO:-4K} $flag --json /tmp/$t$i.json > /dev/null 2>&1
		echo "@@FS-RC $t$i $?"
		emit $t$i.json /tmp/$t$i.json
	done
done
