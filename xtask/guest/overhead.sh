# Tracer overhead: the same bench with the tracer off and on (attribution
# off, per-mapping counts (the default), every attribution on the written
# class), in turn, in one boot, so that the ratios are taken under the same
# conditions.
. /lib.sh
for i in $(seq ${RUNS:-5}); do
	for t in off bare mappings all; do
		case $t in
		off) flags=--no-trace ;;
		bare) flags="--no-mappings --sites none" ;;
		mappings) flags= ;;
		all) flags="--sites reuse,copy --stacks reuse,copy" ;;
		esac
		/faultscope bench seq --size ${SIZE:-64M} --folio ${FOLIO:-4K} $flags --json /tmp/$t$i.json > /dev/null 2>&1
		echo "@@FS-RC $t$i $?"
		emit $t$i.json /tmp/$t$i.json
	done
done
