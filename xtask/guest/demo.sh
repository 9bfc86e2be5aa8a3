# The demo: faultscope bench, the write pass after fork with the child
# exited, for each folio size of $FOLIOS (4K pages, 64K mTHP, PTE-mapped 2M
# THPs).
. /lib.sh
for f in ${FOLIOS:-4K 64K 2M}; do
	/faultscope bench seq --size ${SIZE:-256M} --folio $f --child exit --time-stores \
		--json /tmp/demo$f.json > /tmp/demo$f.out 2>&1
	echo "@@FS-RC demo$f $?"
	emit demo$f.out /tmp/demo$f.out
	emit demo$f.json /tmp/demo$f.json
done
