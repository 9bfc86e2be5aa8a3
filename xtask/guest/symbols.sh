# Looking around a guest kernel: the probe points faultscope may use.
grep -E ' (t|T) ([_a-z]*ptep_set_access_flags[_a-z]*|[_a-z]*contpte[_a-z]*|do_wp_page|wp_page_reuse|handle_mm_fault|folio_add_new_anon_rmap|do_mem_abort|huge_pmd_set_accessed)$' /proc/kallsyms
/faultscope probes
