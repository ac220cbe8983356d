"""The words every layer shares, at the bottom of the package: finding codes and errors (``codes``,
``errors``), input limits (``limits``), did-you-mean (``suggest``), the contract's fields and tiers
(``schema``), how a field's value is checked (``kinds``), the mandate (``mandate``), worker ids
(``worker_ids``), and the recipe block's and the drift metrics' names (``names``); one setting a fix
makes (``change``), wrapping by identity (``patching``), the host versions supported
(``host_versions``) and the exit codes of every command and ``python -m`` entry (``exit_codes``).
Stdlib only; these modules import nothing of the package but each other."""
