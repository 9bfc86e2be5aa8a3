# The demo: faultscope bench, the write pass after fork with the child
# exited, for each folio size of $FOLIOS (4K pages, 64K mTHP, PTE-mapped 2M
# THPs), and each once untraced (`--no-trace`) for its stores' latency.
. /lib.sh
for f in ${FOLIOS:-4K 64K 2M}; do
	/faultscope bench seq --size ${SIZE:-256M} --folio $f --child exit --time-stores \
		--json /tmp/demo$f.json > /tmp/demo$f.out 2>&1
	echo "@@FS-RC demo$f $?"
	emit demo$f.out /tmp/demo$f.out
	emit demo$f.json /tmp/demo$f.json
	# The same stores untraced: what the traced store latency is next to.
	/faultscope bench seq --size ${SIZE:-256M} --folio $f --child exit --time-stores --no-trace \
		--json /tmp/demo$f-untraced.json > /tmp/demo$f-untraced.out 2>&1
	echo "@@FS-RC demo$f-untraced $?"
	emit demo$f-untraced.out /tmp/demo$f-untraced.out
	emit demo$f-untraced.json /tmp/demo$f-untraced.json
done
