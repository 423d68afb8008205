"""Stage 3: the fused module's primitive functions, deduplicated and lowered to TE compute.

``extract`` walks them as upstream's ``ExtractTask`` does and makes the shared ``Task`` records;
``lower`` lowers one function to TE compute; ``vm_compiler`` and ``vm_cache`` give the VM
compiler's order and cache as AutoTVM and Ansor see them; ``cxx`` the libstdc++ behaviours
that shape upstream's names and order.
"""
