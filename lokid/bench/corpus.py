"""The benchmark's corpora: varied prose for the short line, real code for the depth phase.

Prose: paragraphs written for lokid, on unrelated subjects in four languages,
never tiled. A repeated text inflates draft acceptance (each drafted token of
a copy is accepted), which no real chat would see; beyond its length the
short line is completed with code, not with the same prose again.

Code: lokid's own source files (the package's ``.py`` files, in a fixed
order), real and never repeating, so a deep conversation never reads the same
passage twice and an n-gram drafter finds no ready-made copy. The package
grows with the project; its size is reported so a depth phase that runs out
of code says so (partial) instead of looping.
"""

from __future__ import annotations

from pathlib import Path

PROSE = """\
The ferry left the harbour twenty minutes late because a delivery van had parked across the loading ramp, and the deckhands spent the delay arguing about football in three languages. By the time the engines rose to their steady drone, the island was a grey line on the horizon and the passengers had settled into their usual places: the students on the floor by the vending machine, the retired couple at the window, the man with the cello case standing as if the instrument needed to see the sea.
Dans un laboratoire de Grenoble, une doctorante règle un interféromètre pour la quatrième fois de la semaine. Le faisceau dérive de quelques microns dès que la climatisation se déclenche, et elle a fini par noter l'heure de chaque cycle dans un carnet à spirale. Son directeur de thèse lui conseille d'isoler la table ; elle préfère comprendre d'abord d'où vient la vibration.
Soil is not dirt. A single teaspoon of healthy grassland soil holds more microorganisms than there are people on the planet, most of them unnamed. Fungal threads connect the roots of neighbouring plants and move water, sugars and chemical signals between them. When a field is ploughed every season, those networks are torn apart and take years to recover, which is one reason why farmers experiment with direct seeding.
Die Stadtbibliothek öffnet samstags erst um zehn, aber schon um halb zehn steht eine kleine Schlange vor der Glastür. Ein Rentner mit Zeitungen unter dem Arm, zwei Schülerinnen mit Laptops, eine Frau, die jede Woche dieselben drei Kochbücher zurückgibt und wieder ausleiht. Niemand spricht, und trotzdem kennen sich alle vom Sehen.
Garbage collectors trade memory for time in ways that are easy to underestimate. A generational collector assumes that most objects die young, so it scans the nursery often and the old generation rarely. The assumption holds for typical request handlers and breaks down for caches, which keep objects alive just long enough to be promoted and then drop them, forcing expensive full collections at the worst moment.
En la plaza del mercado, un afilador recorre los puestos con su bicicleta y su silbato de caña. Los carniceros le traen cuchillos envueltos en papel de periódico, y él los devuelve con un filo que corta una hoja sin hacer ruido. Dice que aprendió el oficio de su abuelo y que ya casi nadie quiere aprenderlo de él.
The first transatlantic telegraph cable worked for about three weeks in 1858 before its insulation failed under the voltage the engineers applied to push signals through faster. A message of ninety-eight words from the queen to the president had taken sixteen hours to transmit. The lesson about slow, patient signalling over long lines was learned the hard way and shaped cable design for decades.
À la fin du marché, les maraîchers bradent ce qui ne tiendra pas jusqu'à mardi : des fraises trop mûres, des salades un peu fatiguées, des bouquets de coriandre. Une étudiante remplit son sac pour trois euros et repart en calculant combien de soupes elle pourra préparer. Derrière elle, un chien attend patiemment qu'un croûton tombe du stand du boulanger.
Migratory birds navigate with several compasses at once. They read the position of the setting sun, the rotation of the night sky around the pole star, and the inclination of the Earth's magnetic field, which some species seem to perceive through a light-dependent reaction in their eyes. When one cue is hidden by clouds, the others take over, and young birds calibrate them against each other during their first autumn.
Der Zug hält auf freier Strecke, und der Lokführer meldet über die Lautsprecher eine Signalstörung. Einige Fahrgäste seufzen, andere holen Brote aus ihren Rucksäcken. Ein Kind presst die Nase gegen das Fenster und zählt die Kühe auf der Weide, bis es bei siebenundvierzig die Übersicht verliert und von vorne beginnt.
Version control systems disagree about what a change is. Some record snapshots of the whole tree and compute differences when asked; others store the differences and rebuild snapshots on demand. The choice looks academic until a repository reaches millions of files, at which point it decides whether a simple status command returns in a second or in a minute.
Le vieux phare de l'île n'est plus gardé depuis les années quatre-vingt. Une association de bénévoles repeint sa lanterne chaque printemps et organise des visites l'été. Du haut des cent quatorze marches, on aperçoit par temps clair la côte continentale et, certains soirs, le rayon tournant du phare voisin qui, lui, fonctionne toujours.
"""

_CODE: str | None = None


def code() -> str:
    """lokid's own source, file after file, each under a header naming it."""
    global _CODE
    if _CODE is None:
        root = Path(__file__).resolve().parent
        parts = []
        for path in sorted(root.glob("*.py")):
            try:
                parts.append(f"# ---- lokid/{path.name}\n{path.read_text(encoding='utf-8')}")
            except OSError:
                continue
        _CODE = "\n".join(parts)
    return _CODE
